"""How the Trainer times what it calls, under Lightning's action names, at no cost without a profiler.

The hook dispatcher (``framework/loops/hooks.py``) asks ``timed(profiler, action, fn)`` for each
callable it will call, once per run or per epoch, not per call: without a profiler (``None``,
or the default ``PassThroughProfiler``) that is ``fn`` itself, so the default path has no wrapper
and no context manager per call. With one, a wrapper that records ``action`` around each call.

Action names, as Lightning writes them:

- ``[LightningModule]{Module}.{hook}``, ``[LightningDataModule]{DataModule}.{hook}``,
  ``[Callback]{callback.state_key}.{hook}``: each hook fw calls (only the overridden ones: fw
  does not call a hook nobody overrides, Lightning calls every one);
- ``[Strategy]{Strategy}.training_step`` (``validation_step``, ``test_step``, ``predict_step``,
  ``backward``, ``batch_to_device``): the step, the backward and the batch's way to the device;
- ``run_training_epoch``, ``run_training_batch`` (the whole optimization of one batch),
  ``optimizer_step`` (manual optimization), ``save_checkpoint``;
- ``[_TrainingEpochLoop].train_dataloader_next``, ``[_EvaluationLoop].val_next`` /
  ``.test_next``, ``[_PredictionLoop].predict_next``: fetching the next batch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from framework.profilers.base import PassThroughProfiler

if TYPE_CHECKING:
    from framework.profilers.profiler import Profiler
    from framework.trainer.run import Run

F = TypeVar("F", bound=Callable[..., Any])

TRAIN_NEXT = "[_TrainingEpochLoop].train_dataloader_next"
EVAL_NEXT = {"validate": "[_EvaluationLoop].val_next", "test": "[_EvaluationLoop].test_next"}
PREDICT_NEXT = "[_PredictionLoop].predict_next"

_NO_CONTEXT = contextlib.nullcontext()


def active(profiler: Profiler | None) -> Profiler | None:
    """The profiler to time with: None for none or a ``PassThroughProfiler``."""
    return None if profiler is None or type(profiler) is PassThroughProfiler else profiler


def timed(profiler: Profiler | None, action: str, fn: F) -> F:
    """``fn``, or (with a profiler) ``fn`` recorded as ``action`` at each call."""
    if profiler is None:
        return fn
    profile = profiler.profile

    def call(*args: Any, **kwargs: Any) -> Any:
        with profile(action):
            return fn(*args, **kwargs)

    return call  # type: ignore[return-value]


def profiled(profiler: Profiler | None, action: str) -> contextlib.AbstractContextManager:
    """``with profiled(profiler, action):`` for a block run once per epoch or per run."""
    return _NO_CONTEXT if profiler is None else profiler.profile(action)


def fetching(profiler: Profiler | None, iterator: Iterator[Any], action: str, count: float) -> Iterator[Any]:
    """``iterator``, or one whose first ``count`` fetches are recorded as ``action`` (the batches
    the loop uses, as Lightning counts them: a loop that reads one past its limit, or the end of
    a loader with a length, does so unrecorded; without a length, every fetch is recorded)."""
    return iterator if profiler is None else _TimedFetch(iterator, profiler, action, count)


class _TimedFetch:
    __slots__ = ("_action", "_iterator", "_left", "_profile")

    def __init__(self, iterator: Iterator[Any], profiler: Profiler, action: str, count: float) -> None:
        self._iterator, self._profile, self._action, self._left = iterator, profiler.profile, action, count

    def __iter__(self) -> _TimedFetch:
        return self

    def __next__(self) -> Any:
        if self._left <= 0:
            return next(self._iterator)
        self._left -= 1
        with self._profile(self._action):
            return next(self._iterator)


# -- the run's profiler: set up before its hooks, described after them ------------------------------
def start_run(run: Run) -> None:
    """Tell the Trainer's profiler about the run: its stage, this rank (None in a one-process
    job, as in Lightning) and the run folder (``trainer.log_dir``, else ``default_root_dir``)."""
    profiler = run.trainer.profiler
    local_rank = run.strategy.local_rank if run.strategy.world_size > 1 else None
    profiler._lightning_module = run.module
    profiler.setup(stage=run.fn, local_rank=local_rank, log_dir=run.log_dir or run.settings.default_root_dir)


def end_run(run: Run, failed: bool) -> None:
    """The report after a run that finished (Lightning describes only those); after a failure
    the profiler is only torn down (its files closed, torch's profiler stopped)."""
    profiler = run.trainer.profiler
    try:
        if failed:
            profiler.teardown(stage=run.fn)
        else:
            profiler.describe()
    finally:
        profiler._lightning_module = None
