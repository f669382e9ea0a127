"""The Trainer's read-only views with Lightning's names: its settings, where this process and the
run stand (ranks, devices, precision, stage and signal flags), the metrics, the run's parts and
the callbacks, and ``trainer.print`` (the data's are in ``data_properties.py``, ``fit_loop`` in
``fit_loop_view.py``). Kept apart from ``trainer.py`` so that the Trainer's own code (its
arguments, its calls) reads on its own; every name here means what Lightning's does. What belongs to one call (the module, the
metrics) is read from the current (or last) ``Run``; before the first call those answer None or
empty.
What Lightning keeps from one call to the next is read from the last fit (``trainer.last_fit``):
the optimisers and schedulers are the last fit's through validate, test and predict, as
Lightning's strategy keeps them, and so are the training batch counts.
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from framework.callbacks import EarlyStopping, ModelCheckpoint, RichProgressBar
    from framework.callbacks.base import Callback
    from framework.data import DataModule
    from framework.loggers.base import Logger
    from framework.module import TrainModule
    from framework.optim import LRSchedulerConfig
    from framework.precision import Precision
    from framework.run_state.metrics import LoggedMetrics
    from framework.run_state.state import RunState
    from framework.strategies import Strategy
    from framework.strategies.launchers import Launcher
    from framework.trainer.run import Run
    from framework.trainer.settings import Settings


def _setting(name: str) -> property:
    """``trainer.<name>``: the resolved argument of that name (``trainer.settings``)."""
    return property(lambda self: getattr(self.settings, name), doc=f"The resolved ``{name}`` argument.")


def _limit(stage: str) -> property:
    return property(lambda self: _or_all(self.settings.limits[stage]),
                    doc=f"The ``{stage}`` batches to run: a count, or a fraction of each loader (1.0: all).")


def _or_all(value: int | float | None) -> int | float:
    """Lightning's value of a limit or interval that was not given: 1.0 (all of it)."""
    return 1.0 if value is None else value


class TrainerProperties:
    """Mixed into ``Trainer``."""

    settings: Settings
    strategy: Strategy
    state: RunState
    _no_metrics: LoggedMetrics
    callbacks: list[Callback]
    loggers: list[Logger]
    devices: list[int]
    num_nodes: int
    launcher: Launcher | None
    precision_plugin: Precision
    run: Run | None
    last_fit: Run | None

    # -- the settings, under their argument names --------------------------------------------
    max_epochs = _setting("max_epochs")
    min_epochs = _setting("min_epochs")
    min_steps = _setting("min_steps")
    max_steps = _setting("max_steps")
    max_time = _setting("max_time")
    accumulate_grad_batches = _setting("accumulate_grad_batches")
    gradient_clip_val = _setting("gradient_clip_val")
    gradient_clip_algorithm = _setting("gradient_clip_algorithm")
    val_check_interval = property(lambda self: _or_all(self.settings.val_check_interval),
                                  doc="The resolved ``val_check_interval`` (1.0 when not given, as in Lightning).")
    check_val_every_n_epoch = _setting("check_val_every_n_epoch")
    num_sanity_val_steps = _setting("num_sanity_val_steps")
    log_every_n_steps = _setting("log_every_n_steps")
    default_root_dir = _setting("default_root_dir")
    fast_dev_run = _setting("fast_dev_run")
    overfit_batches = _setting("overfit_batches")
    reload_dataloaders_every_n_epochs = _setting("reload_dataloaders_every_n_epochs")
    barebones = _setting("barebones")
    deterministic = _setting("deterministic")
    on_nonfinite = _setting("on_nonfinite")
    limit_train_batches = _limit("train")
    limit_val_batches = _limit("validate")
    limit_test_batches = _limit("test")
    limit_predict_batches = _limit("predict")

    # -- where this process stands -------------------------------------------------------------
    @property
    def global_rank(self) -> int:
        return self.strategy.global_rank

    @property
    def local_rank(self) -> int:
        return self.strategy.local_rank

    @property
    def node_rank(self) -> int:
        return self.strategy.dist.node_rank

    @property
    def world_size(self) -> int:
        """The job's processes; in a process that starts them (``ddp_spawn``, fw's launcher) too,
        as in Lightning, which sets the world size before it launches."""
        launching = self.launcher is not None
        return len(self.devices) * self.num_nodes if launching else self.strategy.world_size

    @property
    def is_global_zero(self) -> bool:
        return self.strategy.is_global_zero

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def device_ids(self) -> list[int]:
        return list(self.devices)

    @property
    def precision(self) -> str:
        """Lightning's name of the run's precision: ``32-true``, ``bf16-mixed``, ``16-mixed``,
        ``64-true``, ``bf16-true`` or ``16-true`` (the object is ``precision_plugin``)."""
        return self.precision_plugin.precision

    @property
    def scaler(self) -> torch.amp.GradScaler | None:
        """The ``GradScaler`` of ``16-mixed`` (None under other precisions)."""
        return self.precision_plugin.scaler

    # -- where the run stands (``self.state``) ----------------------------------------------------
    @property
    def current_epoch(self) -> int:
        return self.state.epoch

    @property
    def global_step(self) -> int:
        return self.state.global_step

    @property
    def should_stop(self) -> bool:
        return self.state.should_stop

    @should_stop.setter
    def should_stop(self, value: bool) -> None:
        self.state.should_stop = bool(value)

    @property
    def sanity_checking(self) -> bool:
        return self.state.stage == "sanity_check"

    @property
    def training(self) -> bool:
        return self.state.stage == "train"

    @property
    def validating(self) -> bool:
        return self.state.stage == "validate"

    @property
    def testing(self) -> bool:
        return self.state.stage == "test"

    @property
    def predicting(self) -> bool:
        return self.state.stage == "predict"

    @property
    def interrupted(self) -> bool:
        return self.state.status == "interrupted"

    @property
    def received_sigterm(self) -> bool:
        """Whether the current (or last) fit received SIGTERM, which stops it with a checkpoint."""
        return self.state.signal == signal.SIGTERM

    @property
    def evaluating(self) -> bool:
        """Whether a validation, test or sanity check runs now."""
        return self.state.stage in ("validate", "test", "sanity_check")

    @property
    def ckpt_path(self) -> str | None:
        """The checkpoint the current (or last) run started from."""
        return self.state.ckpt_path

    @property
    def is_last_batch(self) -> bool:
        return self.state.is_last_batch

    # -- metrics (each call starts with none, as in Lightning) -----------------------------------
    @property
    def metrics(self) -> LoggedMetrics:
        """What the current (or last) call logged."""
        return self.run.metrics if self.run is not None else self._no_metrics

    @property
    def callback_metrics(self) -> dict[str, torch.Tensor]:
        """The last value of every logged metric (the epoch aggregate of an epoch-level one), as in
        Lightning: what ModelCheckpoint and EarlyStopping monitor."""
        return self.metrics.callback_metrics

    @property
    def logged_metrics(self) -> dict[str, torch.Tensor]:
        """What was sent to the loggers (``self.log(..., logger=True)``), as in Lightning."""
        return self.metrics.logged_metrics

    @property
    def progress_bar_metrics(self) -> dict[str, float]:
        """What the progress bar shows (``self.log(..., prog_bar=True)``)."""
        return self.metrics.progress_bar_metrics

    # -- the current (or last) call's parts ------------------------------------------------------
    @property
    def lightning_module(self) -> TrainModule | None:
        return self.run.module if self.run is not None else None

    @property
    def model(self) -> torch.nn.Module | None:
        """The wrapped model (DDP, DataParallel, or the module itself) while a run is on; after
        it, the last call's module (Lightning's strategy keeps it, unwrapped)."""
        return self.strategy.model if self.strategy.model is not None else self.lightning_module

    @property
    def datamodule(self) -> DataModule | None:
        return self.run.datamodule if self.run is not None else None

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        """The last fit's (also in the validate, test and predict calls after it, as in Lightning)."""
        return self.last_fit.optimizers if self.last_fit is not None else []

    @property
    def lr_scheduler_configs(self) -> list[LRSchedulerConfig]:
        """The last fit's, as ``optimizers``."""
        return self.last_fit.lr_scheduler_configs if self.last_fit is not None else []

    @property
    def logger(self) -> Logger | None:
        return self.loggers[0] if self.loggers else None

    @property
    def log_dir(self) -> str | None:
        """The run directory, as Lightning's: the first logger's (the same on every rank), else
        ``default_root_dir``; before the first call, the first logger's as it will be."""
        if self.run is not None and self.run.log_dir is not None:
            return self.run.log_dir
        if not self.loggers:
            return self.default_root_dir
        first = self.loggers[0]
        first.set_default_root(self.default_root_dir)
        return first.log_dir

    # -- callbacks ------------------------------------------------------------------------------
    @property
    def checkpoint_callbacks(self) -> list[ModelCheckpoint]:
        from framework.callbacks import ModelCheckpoint

        return [cb for cb in self.callbacks if isinstance(cb, ModelCheckpoint)]

    @property
    def checkpoint_callback(self) -> ModelCheckpoint | None:
        """The first ModelCheckpoint, or None."""
        found = self.checkpoint_callbacks
        return found[0] if found else None

    @property
    def early_stopping_callbacks(self) -> list[EarlyStopping]:
        from framework.callbacks import EarlyStopping

        return [cb for cb in self.callbacks if isinstance(cb, EarlyStopping)]

    @property
    def early_stopping_callback(self) -> EarlyStopping | None:
        found = self.early_stopping_callbacks
        return found[0] if found else None

    @property
    def progress_bar_callback(self) -> RichProgressBar | None:
        from framework.callbacks import RichProgressBar

        return next((cb for cb in self.callbacks if isinstance(cb, RichProgressBar)), None)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on each machine's first process only, as Lightning's ``trainer.print``."""
        if self.strategy.local_rank == 0:
            print(*args, **kwargs)  # the user's own print, as in Lightning
