"""Evaluation (validate/test): one pass over the stage's loaders in eval mode, no gradients.

Each rank reads its own shard (no padding duplicates, see ``framework/data/sampler_injection.py``);
epoch values are computed once at the end, so ranks may see different numbers of batches and
the collectives happen only in ``compute_epoch``. The same pass serves ``trainer.validate()``,
``trainer.test()``, validation inside fit, and the sanity check (which logs nothing).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from framework.errors import ConfigError
from framework.loops.batches import num_batches, up_to
from framework.loops.eval_batch import batch_call
from framework.loops.transfer import batch_transfer_fn
from framework.module.step_arity import positional_arity
from framework.profilers.timing import EVAL_NEXT

if TYPE_CHECKING:
    from framework.run_state.metric_collector import MetricCollector
    from framework.trainer.run import Run

_LOADER_NAMES = {"validate": "val_dataloader", "test": "test_dataloader"}


def run_eval_stage(run: Run) -> list[dict]:
    """``trainer.validate()`` / ``trainer.test()``: one pass, its scalar results: one dict per
    loader, each with that loader's values and those logged outside its batches (the epoch
    hooks'), as Lightning returns them."""
    fn = run.fn
    loaders = run.loaders.get(fn)
    if not loaders:
        raise ConfigError(f"{fn} needs data: pass dataloaders= or a datamodule with {_LOADER_NAMES[fn]}()")
    nothing = all(num_batches(loader, run.settings.limits[fn]) == 0 for loader in loaders)
    if run.strategy.reduce_boolean_decision(nothing, all=True):  # on no rank (a rank's shard may be empty)
        return []  # no batch to run (limit_*_batches=0): Lightning skips the stage, its hooks too
    values = run_evaluation(run, fn)
    aliases = {k for k in values if f"{k}_epoch" in values or _forked(k, values)}  # Lightning returns x_epoch only
    logged = run.metrics.epoch_flags  # and only what went to the loggers (not ``logger=False``)
    results = {k: float(v) for k, v in values.items()
               if v.numel() == 1 and k not in aliases and logged.get(k, (False, True))[1]}
    loader_of = run.metrics.epoch_loaders
    return [{k: v for k, v in results.items() if loader_of.get(k) in (None, i)} for i in range(len(loaders))]


def _forked(key: str, values: dict) -> bool:
    """Is ``key`` a loader's ``x/dataloader_idx_N`` whose ``x_epoch/dataloader_idx_N`` is there too?"""
    name, cut, idx = key.rpartition("/dataloader_idx_")
    return bool(cut) and f"{name}_epoch{cut}{idx}" in values


def run_evaluation(run: Run, stage: str, limit: int | None = None, log: bool = True, zero_grad: bool = False,
                   epoch_end: bool = False) -> dict:
    """One pass over the ``stage`` loaders in eval mode, no gradients; returns epoch metrics.
    ``zero_grad``: inside fit, free the gradients first (``on_validation_model_zero_grad``).
    ``epoch_end``: the validation at a training epoch's end: once its values are recorded, a
    checkpoint written in ``on_validation_end`` resumes after it (``run_state/position.py``: ``DataPosition``)."""
    module, hooks, state = run.module, run.hooks, run.state
    loaders = run.loaders.get(stage) or []
    name = "validation_step" if stage == "validate" else "test_step"
    arity = positional_arity(getattr(module, name))
    step_fn = hooks.strategy_fn(name, run.precision.converting(run.strategy.step_fn(module, name)))
    prefix = "validation" if stage == "validate" else "test"
    sanity_check = state.stage == "sanity_check"
    outer_stage, state.stage = state.stage, state.stage if sanity_check else stage
    if zero_grad and not sanity_check:
        hooks.module_hook("on_validation_model_zero_grad")
    modes = ModuleModes(module)
    hooks.module_hook(f"on_{prefix}_model_eval")
    try:
        no_grad = run.strategy.no_grad(run.settings.inference_mode)  # Lightning's switch
        with run.metrics.evaluating(stage) as collector, no_grad:
            hooks(f"on_{prefix}_start")
            hooks(f"on_{prefix}_epoch_start")
            call = batch_call(run, step_fn, arity, hooks.per_batch(f"on_{prefix}_batch_start"),
                              hooks.per_batch(f"on_{prefix}_batch_end"), len(loaders))
            for dl_idx, loader in enumerate(loaders):
                run.metrics.dataloader_idx = dl_idx if len(loaders) > 1 else None  # x/dataloader_idx_N
                n = num_batches(loader, run.settings.limits[stage])
                if limit is not None:  # the sanity check: at most ``limit`` of them
                    n = min(n, limit)
                run.num_val_batches = n
                to_device = batch_transfer_fn(run, dl_idx)
                for batch_idx, batch in enumerate(hooks.fetching(up_to(iter(loader), n), EVAL_NEXT[stage], n)):
                    if batch_idx >= n:
                        break
                    batch = run.metrics.current_batch = to_device(batch) if to_device is not None else batch
                    run.state.eval_batches += 1
                    call(batch, batch_idx, dl_idx)
                    if log and not sanity_check:
                        _log_eval_step(run, collector, stage, dl_idx)
            run.metrics.dataloader_idx = None  # the epoch hooks log for every loader
            values = _end_evaluation_epoch(run, collector, prefix, log and not sanity_check)
            state.position.validated = epoch_end
            hooks(f"on_{prefix}_end")
    finally:
        state.stage, run.metrics.dataloader_idx = outer_stage, None
        if hooks.module_overrides(f"on_{prefix}_model_train"):
            hooks.module_hook(f"on_{prefix}_model_train")
        else:
            modes.restore()
    return values


def _log_eval_step(run: Run, collector: MetricCollector, stage: str, dl_idx: int) -> None:
    """After each evaluation batch (not the sanity check's), the step values logged with
    ``on_step=True`` go to the loggers at the loader's batch count, as Lightning sends them."""
    key = (stage, dl_idx)
    step = run.eval_steps.get(key, 0)
    run.eval_steps[key] = step + 1
    loader = run.metrics.dataloader_idx
    run.metrics.eval_step_bar.update(collector.step_values_for("prog_bar", loader))
    values = collector.step_values_for("logger", loader)  # this loader's alone
    run.metrics.eval_step_logged.update(values)
    if values and run.loggers:
        run.trainer.log_metrics({k: float(v) for k, v in values.items()}, step)


def _end_evaluation_epoch(run: Run, collector: MetricCollector, prefix: str, log: bool) -> dict:
    """The epoch's values first, so that ``on_*_epoch_end`` (callbacks, then the module) sees
    them in ``callback_metrics``; then what those hooks logged. The sanity check's values are
    seen by its hooks and dropped after it, as in Lightning."""
    strategy, module = run.strategy, run.module
    with run.metrics.kept(not log):
        hook = f"on_{prefix}_epoch_end"
        collector.compute_epoch(strategy, module, final=False, hooks_may_log=run.hooks.epoch_end_may_log(hook))
        run.metrics.record_epoch(collector)
        run.hooks(hook)
        values = collector.compute_epoch(strategy, module, final=True)
        run.metrics.record_epoch(collector)
    if log:
        log_epoch_metrics(run, collector)
    return values


class ModuleModes:
    """Every submodule's train/eval mode, captured now and put back by ``restore`` (a frozen
    submodule in eval mode stays so after validation, as in Lightning)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self.modes = {name: m.training for name, m in module.named_modules()}

    def restore(self) -> None:
        for name, m in self.module.named_modules():
            if name in self.modes:
                m.training = self.modes[name]


def log_epoch_metrics(run: Run, collector: MetricCollector) -> None:
    """Send ``collector``'s scalar epoch values that may be logged to the loggers."""
    metrics = {k: float(v) for k, v in collector.epoch_values.items()   # the ``x_epoch`` names, not the
               if v.numel() == 1 and collector.epoch_flags.get(k, (False, False))[1]}  # plain ``x`` alias
    if metrics:
        log_row(run, metrics)


def log_row(run: Run, metrics: dict[str, float]) -> None:
    """A row of ``self.log``'s values to the loggers, as Lightning writes it: a logged ``step`` is
    the row's step (not a column, and the row gets no epoch); else the run's step, and the run's
    epoch unless ``epoch`` was logged."""
    step = metrics.pop("step", None)
    if step is None:
        metrics.setdefault("epoch", run.state.epoch)
        step = run.state.logger_step
    run.trainer.log_metrics(metrics, int(step))
