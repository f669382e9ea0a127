"""What a run shows on rank 0 (stderr): the line through logging of what it runs on at the start
(with the model summary of ``enable_model_summary``, whose table is ``ModelSummary``'s), at the end
of a fit the line of where it stopped, why, and where its logs and checkpoints are, and the results
table of ``validate`` and ``test`` (``verbose=True``: each logged metric per loader), as Lightning's."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from framework.callbacks.model_summary import ModelSummary, print_model_summary, short_count
from framework.rank_zero import rank_zero_info

if TYPE_CHECKING:
    from framework.trainer.run import Run


def print_summary(run: Run) -> None:
    """One line on rank 0: strategy, backend, init method, world size, device, batch sizes
    (nothing for predict, or when the stage has no data: its loop says so)."""
    fn, strategy = run.fn, run.strategy
    loaders = run.loaders.get({"fit": "train"}.get(fn, fn)) or []
    if fn == "predict" or not loaders:
        return
    per_device_batch = getattr(loaders[0], "batch_size", None)
    info = strategy.describe()
    parts = [f"fw {fn}: strategy {strategy.name}"]
    if "backend" in info:
        parts.append(f"backend {info['backend']}, init {info['init_method']}")
    world = strategy.world_size
    parts.append(f"world size {world}" + (f", {info['threads']} thread(s) per process"
                                          if world > 1 and "threads" in info else ""))
    parts.append(f"device {info['device']}, precision {run.precision.precision}")
    if per_device_batch:
        parts.append(_batch_sizes(per_device_batch, info.get("replicas", 1), world, strategy.data_parallel_size))
    if fn == "fit":
        parts.append(parameter_bytes(run.module))
    rank_zero_info(" | ".join(parts))
    given = any(isinstance(cb, ModelSummary) for cb in run.callbacks)  # it prints its own, at on_fit_start
    if fn == "fit" and run.settings.enable_model_summary and not given and strategy.is_global_zero:
        print_model_summary(run.module)


def _batch_sizes(loader_batch: int, replicas: int, world: int, data_parallel: int) -> str:
    """The batch each device computes on and the global batch: the loader's batch on each
    data-parallel rank (``dp``: one batch split over its GPUs). Ranks that split the model
    (``model_parallel``'s tensor-parallel ranks) read the same batch: they count once."""
    per_device = loader_batch // replicas if replicas > 1 else loader_batch
    text = f"batch {per_device} per device, global {per_device * replicas * data_parallel}"
    if world > data_parallel:
        text += f" ({world // data_parallel} ranks share each batch)"
    return text


def report_where_it_went(run: Run) -> None:
    """One line at the end of a fit: where its logs and its best and last checkpoints are."""
    from framework.callbacks import ModelCheckpoint

    parts = [f"fw fit: done at step {run.state.global_step}, {_why_it_stopped(run)}"]
    if run.log_dir:
        parts.append(f"logs in {run.log_dir}")
    for cb in run.callbacks:
        if not isinstance(cb, ModelCheckpoint):
            continue
        if cb.best_model_path:
            parts.append(f"best checkpoint {cb.best_model_path}")
        if cb.last_model_path and cb.last_model_path != cb.best_model_path:
            parts.append(f"last checkpoint {cb.last_model_path}")
    rank_zero_info(" | ".join(parts))


def _why_it_stopped(run: Run) -> str:
    reason, settings = run.state.stop_reason, run.settings
    if reason == "max_steps":
        return f"max_steps={settings.max_steps} reached"
    if reason == "max_epochs":
        return f"max_epochs={settings.max_epochs} reached"
    if reason == "max_time":
        return f"max_time={settings.max_time:g}s reached"
    if reason == "preempted":
        return "stopped by a signal"
    if reason == "no_training_batches":
        return f"limit_train_batches={settings.limits['train']!r} left no training batch"
    for cb in run.callbacks:  # EarlyStopping (and any callback that says why it stopped the fit)
        message = getattr(cb, "stopping_reason_message", None)
        if isinstance(message, str) and message:
            return f"stopped by {type(cb).__name__}: {message.removesuffix('; stopping.').removesuffix('.')}"
    return "stopped by trainer.should_stop"


def print_results(fn: str, results: list[dict[str, float]]) -> None:
    """``validate``/``test``'s results, one column per loader, as Lightning's ``verbose`` table."""
    from rich.console import Console
    from rich.table import Table

    if len(results) > 1:  # one row per metric, a column per loader, as in Lightning
        results = [{k.rpartition("/dataloader_idx_")[0] or k: v for k, v in r.items()} for r in results]
    names = sorted({name for per_loader in results for name in per_loader})
    if not names:
        return
    table = Table(title=f"{fn} results", title_justify="left")
    table.add_column("Metric")
    for i in range(len(results)):
        table.add_column("value" if len(results) == 1 else f"dataloader {i}", justify="right")
    for name in names:
        table.add_row(name, *(f"{r[name]:.6g}" if name in r else "" for r in results))
    Console(stderr=True).print(table)


def parameter_bytes(module: nn.Module) -> str:
    """The bytes of parameters this rank holds, and of the whole model where it holds a shard
    (FSDP: a parameter is a DTensor whose ``numel`` is the whole tensor's)."""
    local = whole = 0
    for p in module.parameters():
        mine = p.to_local() if hasattr(p, "to_local") else p
        local += mine.numel() * mine.element_size()
        whole += p.numel() * p.element_size()
    share = f" of {_bytes(whole)}" if local != whole else ""
    return f"parameters {_bytes(local)} per rank{share}"


def _bytes(n: int) -> str:
    return short_count(n, ("GB", "MB", "kB"), ones="B")
