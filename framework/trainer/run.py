"""``Run``: one call of the Trainer (``fit``, ``validate``, ``test``, ``predict``) and what it built.

Set-up (``setup.py``) builds a ``Run`` for each call; the loops (``framework.loops``) take it and
read everything from it: the module and the data, the optimisers and schedulers, the hooks, the
metrics, where the run stands (``state``) and the Trainer's frozen ``settings``. The next call
builds a new one, so nothing of a call has to be reset on the Trainer. Between calls the Trainer
keeps what Lightning's keeps, so that its properties answer after a call as Lightning's do: the
last call's Run (``trainer.run``: the module, the loaders, the metrics), the last fit's
(``trainer.last_fit``: its optimizers and schedulers, which Lightning's strategy keeps through
validate, test and predict, its batch counts and what ``save_checkpoint`` writes after it), and
the batches per loader of the last validate, test and predict (``trainer.batch_counts``, as
Lightning's loops keep their ``max_batches``). A Run that ended holds no live part: teardown
shuts its loaders' worker processes down and drops its last batch, as Lightning does.
A ``Call`` is the public call as it was made (what a launcher hands its workers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from framework.data import DataModule
from framework.data.run_loaders import shut_down_workers
from framework.errors import ConfigError
from framework.loops.batches import num_batches
from framework.loops.hooks import HookDispatcher
from framework.run_state.metrics import LoggedMetrics

if TYPE_CHECKING:
    from framework.accelerators import Accelerator
    from framework.callbacks.base import Callback
    from framework.checkpointing.parts import EndOfFit
    from framework.data.run_loaders import LoaderSource
    from framework.loggers.base import Logger
    from framework.module import TrainModule
    from framework.module.manual_optimization import ManualOptimization
    from framework.optim import LRSchedulerConfig
    from framework.precision import Precision
    from framework.run_state.state import RunState
    from framework.strategies import Strategy
    from framework.trainer.preemption import StopCheck
    from framework.trainer.settings import Settings
    from framework.trainer.trainer import Trainer


@dataclass(eq=False, slots=True)
class Run:
    """One Trainer call. The first block is the Trainer's (shared by its calls), the rest this
    call's own.

    Attributes:
        fn: ``fit``, ``validate``, ``test`` or ``predict``.
        trainer: the Trainer (what hooks and callbacks are handed).
        settings, strategy, accelerator, precision, state, loggers: the Trainer's.
        metrics: what this call logged (each call starts with none, as in Lightning).
        callbacks: the Trainer's, with those of ``configure_callbacks()`` in place.
        module, datamodule: what the call runs on.
        hooks: the one way hooks are called (``loops/hooks.py``).
        loaders: the loaders per stage key (``train``, ``validate``, ``test``, ``predict``),
            sharded for this rank; ``loader_source`` asks for them again (reloads).
        optimizers, lr_scheduler_configs: a fit's, from ``configure_optimizers``.
        manual: a fit in manual optimization: its ``module/manual_optimization.ManualOptimization``.
        num_training_batches, num_val_batches: batches per epoch of the stage running (for the
            progress bar and the schedules).
        fit_batches: a fit's training batches per epoch, what ``trainer.num_training_batches``
            reports (from ``trainer.last_fit``): from when its training starts (after the sanity
            check); until then the fit before's, as Lightning's fit loop keeps its
            ``max_batches``; None before any.
        return_predictions: ``predict``'s ``return_predictions``.
        log_dir: the run directory (the first logger's, the same on every rank).
        process_settings: what ``deterministic``/``benchmark`` changed, to be put back.
        stop_check: a fit's joint check for stop signals and ``max_time`` (``preemption.py``).
        eval_steps: per (stage, loader), the evaluation batches run in this call: the step at
            which an evaluation's step values are logged (Lightning's per-loader count, which
            a fit's validations share).
        end_of_fit: a distributed fit's, on rank 0: what it left for a ``save_checkpoint`` after
            it (``parts.EndOfFit``); the calls after it reach it through ``trainer.last_fit``.
    """

    fn: str
    trainer: Trainer
    settings: Settings
    strategy: Strategy
    accelerator: Accelerator
    precision: Precision
    state: RunState
    metrics: LoggedMetrics
    loggers: list[Logger]
    callbacks: list[Callback]
    module: TrainModule
    hooks: HookDispatcher
    datamodule: DataModule | None = None
    loaders: dict[str, list] = field(default_factory=dict)
    loader_source: LoaderSource | None = None
    optimizers: list = field(default_factory=list)
    lr_scheduler_configs: list[LRSchedulerConfig] = field(default_factory=list)
    manual: ManualOptimization | None = None
    num_training_batches: float = math.inf
    num_val_batches: int | float = 0
    fit_batches: float | None = None
    return_predictions: bool = True
    log_dir: str | None = None
    process_settings: tuple[Any, ...] | None = None
    stop_check: StopCheck | None = None
    eval_steps: dict[tuple[str, int], int] = field(default_factory=dict)
    end_of_fit: EndOfFit | None = None

    @classmethod
    def of(cls, trainer: Trainer, fn: str, module: TrainModule, callbacks: list[Callback],
           datamodule: DataModule | None = None) -> Run:
        """A new call's Run: the Trainer's shared parts, a hook dispatcher over ``callbacks``, no
        metrics yet."""
        metrics = LoggedMetrics()
        before = trainer.last_fit.fit_batches if fn == "fit" and trainer.last_fit is not None else None
        return cls(fn=fn, trainer=trainer, settings=trainer.settings, strategy=trainer.strategy,
                   accelerator=trainer.accelerator, precision=trainer.precision_plugin, state=trainer.state,
                   metrics=metrics, loggers=trainer.loggers, callbacks=callbacks, module=module,
                   hooks=HookDispatcher(callbacks, trainer, module, metrics), datamodule=datamodule,
                   fit_batches=before)

    def make_current(self) -> None:
        """This is the Trainer's call now (``trainer.run``); a fit the last fit (``trainer.last_fit``)."""
        self.trainer.run = self
        if self.fn == "fit":
            self.trainer.last_fit = self

    def keep_batch_counts(self) -> None:
        """A validate, test or predict: its batches per loader, kept on the Trainer until the next
        call of its kind (``trainer.num_test_batches``, ...), as Lightning's loops keep theirs. (A
        fit's are read from its loaders, which ``trainer.last_fit`` keeps for ``save_checkpoint``.)"""
        if self.fn != "fit":
            limit = self.settings.limits[self.fn]
            self.trainer.batch_counts[self.fn] = [num_batches(loader, limit) for loader in self.loaders.get(self.fn, [])]

    def release(self) -> None:
        """What a call that ended must not keep alive (Lightning releases both at every call's
        end): its loaders' worker processes (``persistent_workers=True`` keeps them between
        epochs) and the last batch, on the device."""
        self.metrics.current_batch = None
        for loaders in self.loaders.values():
            shut_down_workers(loaders)


@dataclass(frozen=True)
class Call:
    """One public call as it was made: what a launcher hands to its workers."""

    fn: str
    model: TrainModule | None
    datamodule: DataModule | None
    loaders: dict[str, Any]
    ckpt_path: str | None
    verbose: bool = True
    return_predictions: bool = True


def one_datamodule(given: DataModule, datamodule: DataModule | None) -> DataModule:
    if datamodule is not None:
        raise ConfigError("a DataModule was given twice (positionally and as datamodule=); pass it once")
    return given


def split_datamodule(dataloaders: Any, datamodule: DataModule | None) -> tuple[Any, DataModule | None]:
    if isinstance(dataloaders, DataModule):
        return None, one_datamodule(dataloaders, datamodule)
    return dataloaders, datamodule
