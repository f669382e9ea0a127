"""Where fw deliberately differs from Lightning, said once per process at the end of set-up (a run
refused at set-up prints only its error), when the user's code relies on it without having
chosen (the page at ``DOCS``, "Coming from Lightning", lists them all).

Each difference is a condition on the run (its module, loaders, callbacks, strategy) and one
short line on rank 0: what differs, the setting that chooses (where there is one: stating it,
as fw's own recipes do, says nothing) and ``DOCS``. Nothing here changes the run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from framework.loops.hooks import overrides
from framework.rank_zero import rank_zero_info

if TYPE_CHECKING:
    from framework.trainer.run import Run

#: Where the differences are explained (one place to change when the docs move).
DOCS = "docs/lightning.md#where-fw-deliberately-differs"

_said: set[str] = set()


def note_differences(run: Run, ckpt_path: str | None) -> None:
    """One line for each difference this run meets, the first time this process meets it."""
    fn = run.fn
    for key, applies, line in _DIFFERENCES:
        if key not in _said and applies(run, fn, ckpt_path):
            _said.add(key)
            rank_zero_info(f"fw: differs from Lightning: {line}; see {DOCS}")


def _distributed_fit(run: Run, fn: str) -> bool:
    return fn == "fit" and run.strategy.is_distributed


def _unshuffled_training_under_ddp(run: Run, fn: str, _: str | None) -> bool:
    if not _distributed_fit(run, fn) or not run.settings.use_distributed_sampler:
        return False
    loaders = run.loaders.get("train") or []
    shuffle = getattr(getattr(loaders[0], "sampler", None), "shuffle", None) if loaders else None
    return shuffle is False  # a DistributedSampler that keeps the loader's order


def _global_order_in_one_process(run: Run, fn: str, _: str | None) -> bool:
    if fn != "fit" or run.strategy.is_distributed or run.settings.sampler_chosen:
        return False
    loaders = run.loaders.get("train") or []
    return bool(loaders) and getattr(getattr(loaders[0], "sampler", None), "shuffle", False) is True


def _uneven_evaluation_shards(run: Run, fn: str, _: str | None) -> bool:
    if not run.strategy.is_distributed:
        return False
    stages = ("validate",) if fn == "fit" else (fn,)
    for stage in stages:
        for loader in run.loaders.get(stage) or []:
            size = len(loader.dataset) if hasattr(getattr(loader, "dataset", None), "__len__") else None
            if size is not None and size % run.strategy.world_size:
                return True
    return False


def _manual_under_ddp(run: Run, fn: str, _: str | None) -> bool:
    return _distributed_fit(run, fn) and not run.module.automatic_optimization


def _restore_after_configure_optimizers(run: Run, fn: str, ckpt_path: str | None) -> bool:
    from framework.module import TrainModule

    return fn == "fit" and ckpt_path is not None and overrides(run.module, TrainModule, "on_load_checkpoint")


def _loaders_before_fit_start(run: Run, fn: str, _: str | None) -> bool:
    """A module with its own fit-start hooks whose loaders come from methods (not passed in)."""
    from framework.data import DataModule
    from framework.module import TrainModule

    if fn != "fit" or not any(overrides(run.module, TrainModule, h) for h in ("on_fit_start", "on_train_start")):
        return False
    if run.datamodule is not None:
        return overrides(run.datamodule, DataModule, "train_dataloader")
    return overrides(run.module, TrainModule, "train_dataloader")


def _plateau_before_checkpoint(run: Run, fn: str, _: str | None) -> bool:
    from torch.optim.lr_scheduler import ReduceLROnPlateau

    from framework.callbacks import EarlyStopping, ModelCheckpoint

    return (fn == "fit" and any(isinstance(c.scheduler, ReduceLROnPlateau) and c.interval == "epoch"
                                for c in run.lr_scheduler_configs)
            and any(isinstance(cb, (ModelCheckpoint, EarlyStopping)) for cb in run.callbacks))


def _last_checkpoint_is_the_latest(run: Run, fn: str, _: str | None) -> bool:
    from framework.callbacks import ModelCheckpoint

    return fn == "fit" and any(isinstance(cb, ModelCheckpoint) and cb.save_last is True and cb.monitor
                               for cb in run.callbacks)


def _fp16_autocast_on_the_cpu(run: Run, fn: str, _: str | None) -> bool:
    return run.precision.precision == "16-mixed" and run.precision.device_type == "cpu"


_DIFFERENCES: list[tuple[str, Callable[[Run, str, str | None], bool], str]] = [
    ("no forced shuffle", _unshuffled_training_under_ddp,
     "an unshuffled training loader keeps its order under DDP (Lightning shuffles it); DataLoader(shuffle=True) "
     "shuffles"),
    ("one order", _global_order_in_one_process,
     "a shuffled training loader reads one order for any number of ranks, not RandomSampler's; "
     "Trainer(use_distributed_sampler=False) keeps the loader's (Lightning's), =True chooses fw's"),
    ("exact evaluation", _uneven_evaluation_shards,
     "evaluation shards are not padded, so no sample counts twice (Lightning repeats some)"),
    ("manual under DDP", _manual_under_ddp,
     "manual optimization averages the gradients over the ranks when an optimizer steps, not in manual_backward"),
    ("restore order", _restore_after_configure_optimizers,
     "the checkpoint is restored after configure_optimizers (Lightning calls on_load_checkpoint before it)"),
    ("loaders at set-up", _loaders_before_fit_start,
     "the loaders are asked for once at set-up, before configure_optimizers and on_fit_start"),
    ("plateau before checkpoint", _plateau_before_checkpoint,
     "ReduceLROnPlateau steps before ModelCheckpoint and EarlyStopping at the epoch's end (Lightning: after)"),
    ("16-mixed on the CPU", _fp16_autocast_on_the_cpu,
     "precision=16-mixed on the CPU is float16 autocast (Lightning 2.6: bf16-mixed); precision=bf16-mixed "
     "gives Lightning's"),
    ("last.ckpt", _last_checkpoint_is_the_latest,
     "last.ckpt is the latest save point, not the latest top-k save; ModelCheckpoint(save_last='latest') "
     "chooses fw's"),
]
