"""The Trainer: builds the parts of a run from its arguments and drives the loops.

It owns its accelerator, strategy, precision, callbacks and loggers and passes them what they
need. Where the run stands lives in one ``RunState`` (``trainer.state``), what it logged in
``trainer.metrics``. The loops are in ``framework.loops``; set-up and teardown in ``setup.py``,
checkpoint save and resume in ``checkpointing.py`` beside this file.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from typing import Any

import torch

from framework import loops
from framework.accelerators import get_accelerator
from framework.callbacks.base import Callback
from framework.data import DataModule
from framework.environments import DistInfo, detect_environment
from framework.errors import ConfigError
from framework.module import TrainModule
from framework.precision import Precision
from framework.rank_zero import rank_zero_info
from framework.strategies import Strategy, create_strategy
from framework.strategies.launchers import die_with_launcher, record_worker_error
from framework.trainer import arguments as args
from framework.trainer import checkpointing, setup
from framework.trainer.heartbeat import Heartbeat
from framework.trainer.metrics import LoggedMetrics
from framework.trainer.properties import TrainerProperties
from framework.trainer.signals import SignalCatcher, save_after_signal
from framework.trainer.state import RunState


class Trainer(TrainerProperties):
    """Runs fit/validate/test/predict for a ``TrainModule``. Keyword names follow Lightning's.

    This signature is the one list of the Trainer's arguments: the recipe schema
    (``framework.config.schema.TrainerConfig``) is derived from it.

    Args:
        accelerator: ``cpu``, ``cuda`` or ``auto``.
        devices: devices per node (int, list of CUDA indices, or ``auto``).
        num_nodes: nodes in the job; ``devices * num_nodes`` is the world size.
        strategy: ``single``, ``dp``, ``ddp``, ``ddp_gloo``, ``ddp_nccl``, ``mpi``, ``auto``, a
            mapping ``{name: ..., init_method: ..., timeout: ...}`` or a Strategy.
        precision: ``32``, ``bf16-mixed`` or ``16-mixed``.
        max_epochs, min_epochs, max_steps, max_time: when to stop (max_time: seconds,
            ``"DD:HH:MM:SS"`` or ``{days, hours, minutes, seconds}``).
        accumulate_grad_batches: optimiser step every k batches (DDP skips the all-reduce on
            the k-1 others).
        gradient_clip_val, gradient_clip_algorithm: clip by ``norm`` (None: norm) or ``value``;
            ``configure_gradient_clipping`` receives both as given, as in Lightning.
        val_check_interval: validate every N train batches (int) or fraction of an epoch.
        check_val_every_n_epoch, num_sanity_val_steps, log_every_n_steps: as in Lightning.
        limit_{train,val,test,predict}_batches: int (batches) or float (fraction).
        callbacks, logger: callbacks list; logger ``True`` (TensorBoard), ``False``, a Logger
            or a list.
        enable_checkpointing, enable_progress_bar: add the default ModelCheckpoint /
            progress bar unless one was given.
        default_root_dir: where logs and checkpoints go (default: the working directory).
        deterministic: ``torch.use_deterministic_algorithms`` during this Trainer's runs.
        max_restarts, rdzv_endpoint: passed to the elastic agent when fw launches workers.
        on_nonfinite: a NaN or infinite loss ``error`` (default: stop, naming the step), ``skip``
            (drop that optimizer step on every rank) or ``warn`` (go on). Either way no
            checkpoint is written over a good one with non-finite weights.
    """

    def __init__(
        self,
        accelerator: str = "auto",
        strategy: Any = "auto",
        devices: Any = "auto",
        num_nodes: int = 1,
        precision: Any = "32",
        logger: Any = True,
        callbacks: list[Callback] | Callback | None = None,
        max_epochs: int | None = None,
        min_epochs: int | None = None,
        max_steps: int = -1,
        max_time: Any = None,
        limit_train_batches: int | float | None = None,
        limit_val_batches: int | float | None = None,
        limit_test_batches: int | float | None = None,
        limit_predict_batches: int | float | None = None,
        val_check_interval: int | float | None = None,
        check_val_every_n_epoch: int | None = 1,
        num_sanity_val_steps: int = 2,
        log_every_n_steps: int = 50,
        enable_checkpointing: bool = True,
        enable_progress_bar: bool = True,
        accumulate_grad_batches: int = 1,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
        deterministic: bool = False,
        default_root_dir: str | None = None,
        max_restarts: int = 0,
        rdzv_endpoint: str | None = None,
        on_nonfinite: str = "error",
        preemption_signal: str | None = "SIGUSR1",
        requeue: bool = False,
        enable_model_summary: bool = True,
        fast_dev_run: int | bool = False,
        overfit_batches: int | float = 0.0,
        reload_dataloaders_every_n_epochs: int = 0,
        benchmark: bool | None = None,
        detect_anomaly: bool = False,
        inference_mode: bool = True,
        use_distributed_sampler: bool = True,
        sync_batchnorm: bool = False,
        barebones: bool = False,
        profiler: Any = None,
    ) -> None:
        # where the run happens: accelerator, devices, strategy, and how its processes start
        self.accelerator = get_accelerator(accelerator)
        self.num_nodes = args.positive_int("num_nodes", num_nodes)
        self.environment = detect_environment()
        self.devices = args.parse_devices(args.devices_for(devices, self.environment, self.accelerator),
                                          self.accelerator)
        self.strategy: Strategy = create_strategy(
            args.default_strategy(strategy, len(self.devices) * self.num_nodes), self.accelerator.name
        )
        self.strategy.check(devices, len(self.devices), self.num_nodes, self.environment)
        self.strategy.connect(self.accelerator, self._dist_info(), self.devices)
        self.launcher = self.strategy.launcher(self.environment, self.num_nodes, int(max_restarts), rdzv_endpoint)
        die_with_launcher()
        self.precision = Precision(precision, self.accelerator.name)

        # when to stop, validate, log, step
        if max_epochs is None and max_steps == -1 and max_time is None:
            max_epochs = 1000
        self.max_epochs = max_epochs if max_epochs is not None else -1
        self.min_epochs = min_epochs or 0
        self.max_steps = int(max_steps)
        self.max_time = args.parse_max_time(max_time)
        self.limits = {
            "train": args.limit_arg("limit_train_batches", limit_train_batches),
            "validate": args.limit_arg("limit_val_batches", limit_val_batches),
            "test": args.limit_arg("limit_test_batches", limit_test_batches),
            "predict": args.limit_arg("limit_predict_batches", limit_predict_batches),
        }
        self.val_check_interval = args.check_val_check_interval(val_check_interval)
        if check_val_every_n_epoch is not None:
            args.positive_int("check_val_every_n_epoch", check_val_every_n_epoch)
        self.check_val_every_n_epoch = check_val_every_n_epoch
        self.num_sanity_val_steps = int(num_sanity_val_steps)
        self.log_every_n_steps = args.positive_int("log_every_n_steps", log_every_n_steps)
        self.accumulate_grad_batches = args.positive_int("accumulate_grad_batches", accumulate_grad_batches)
        self.gradient_clip_val = gradient_clip_val
        self.gradient_clip_algorithm = args.clip_algorithm(gradient_clip_algorithm)
        self.deterministic = bool(deterministic)
        self.on_nonfinite = args.one_of("on_nonfinite", on_nonfinite, ("error", "skip", "warn"))
        self.preemption_signal = args.signal_arg("preemption_signal", preemption_signal)
        self.requeue = bool(requeue)
        self.default_root_dir = os.fspath(default_root_dir) if default_root_dir else os.getcwd()

        # Lightning's debugging, speed and data switches
        if profiler is not None:
            raise ConfigError(f"trainer.profiler={profiler!r}: fw has no profiler of its own; wrap trainer.fit in "
                              "torch.profiler.profile(...), or add the ThroughputMonitor callback for step times")
        self.barebones = bool(barebones)
        if self.barebones:  # nothing that costs time per step besides the step itself
            logger, enable_checkpointing, enable_progress_bar, enable_model_summary = False, False, False, False
            self.num_sanity_val_steps = 0
        self.enable_model_summary = bool(enable_model_summary)
        self.overfit_batches = args.limit_arg("overfit_batches", overfit_batches) or 0
        if self.overfit_batches:  # the same first batches every epoch, for training and validation
            self.limits["train"] = self.limits["validate"] = self.overfit_batches
        self.fast_dev_run = args.fast_dev_run_arg(fast_dev_run)
        if self.fast_dev_run:
            n = self.fast_dev_run
            if not self.overfit_batches:
                self.limits["train"] = self.limits["validate"] = n
            self.limits["test"] = self.limits["predict"] = n
            self.max_steps, self.max_epochs, self.num_sanity_val_steps = n, 1, 0
            self.val_check_interval, self.check_val_every_n_epoch = None, 1
            logger = False
        self.reload_dataloaders_every_n_epochs = args.non_negative_int(
            "reload_dataloaders_every_n_epochs", reload_dataloaders_every_n_epochs)
        self.benchmark = benchmark if benchmark is None else bool(benchmark)
        self.detect_anomaly = bool(detect_anomaly)
        self.inference_mode = bool(inference_mode)
        self.use_distributed_sampler = bool(use_distributed_sampler)
        self.strategy.sync_batchnorm = bool(sync_batchnorm)

        # the parts a run calls into, and what it produces
        self.callbacks = setup.default_callbacks(
            args.check_callbacks(args.as_list(callbacks)), enable_checkpointing, enable_progress_bar
        )
        if self.fast_dev_run:  # Lightning's rule: no checkpoints, early stops or LR logs in a dev run
            self.callbacks = setup.without_dev_run_callbacks(self.callbacks)
            rank_zero_info(f"fw: fast_dev_run={self.fast_dev_run}: {self.fast_dev_run} batch(es) per stage, "
                            "without logging or checkpoints")
        self.loggers = setup.resolve_loggers(logger)
        self.log_dir: str | None = None
        self.state = RunState()
        self.metrics = LoggedMetrics()
        self.module = None
        self.datamodule: DataModule | None = None
        self.loaders: dict[str, list] = {}
        self.hooks = None  # a HookDispatcher while a run is on
        self.optimizers: list[torch.optim.Optimizer] = []
        self.lr_scheduler_configs: list = []
        self.manual = None  # a fit in manual optimization: its loops/manual.ManualOptimization
        self.num_training_batches: float = math.inf
        self.num_val_batches = 0

    # -- where this process stands -------------------------------------------------------------
    @property
    def global_rank(self) -> int:
        return self.strategy.global_rank

    @property
    def local_rank(self) -> int:
        return self.strategy.local_rank

    @property
    def world_size(self) -> int:
        return self.strategy.world_size

    @property
    def is_global_zero(self) -> bool:
        return self.strategy.is_global_zero

    @property
    def logger(self):
        return self.loggers[0] if self.loggers else None

    @property
    def lightning_module(self):
        return self.module

    @property
    def model(self):
        """The wrapped model (DDP, DataParallel, or the module itself) while a run is on."""
        return self.strategy.model

    # -- where the run stands (all of it in ``self.state``) -------------------------------------
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
    def stage(self) -> str | None:
        """The call that runs (``fit``, ``validate``, ``test``, ``predict``), else None."""
        return self.state.fn

    # -- metrics --------------------------------------------------------------------------------
    @property
    def callback_metrics(self) -> dict[str, torch.Tensor]:
        return self.metrics.callback_metrics

    @property
    def logged_metrics(self) -> dict[str, torch.Tensor]:
        return self.metrics.callback_metrics

    @property
    def progress_bar_metrics(self) -> dict[str, float]:
        return self.metrics.progress_bar_metrics

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Send ``metrics`` to every logger (rank 0 only; other ranks do nothing)."""
        if not self.is_global_zero or not metrics:
            return
        for lg in self.loggers:
            lg.log_metrics(metrics, step)

    # -- public API -----------------------------------------------------------------------------
    def fit(self, model, train_dataloaders=None, val_dataloaders=None, datamodule=None, ckpt_path=None) -> None:
        """Train ``model``; ``ckpt_path`` (a path, ``"last"`` or ``"best"``) resumes from a
        checkpoint. A DataModule may be given in place of ``train_dataloaders``, as in Lightning."""
        if isinstance(train_dataloaders, DataModule):
            train_dataloaders, datamodule = None, _one_datamodule(train_dataloaders, datamodule)
        self._run("fit", model, datamodule, {"train": train_dataloaders, "validate": val_dataloaders},
                  ckpt_path, loops.run_fit)

    def validate(self, model=None, dataloaders=None, ckpt_path=None, verbose: bool = True,
                 datamodule=None) -> list[dict]:
        """One pass over the validation data; the logged epoch values, one dict per loader."""
        dataloaders, datamodule = _split_datamodule(dataloaders, datamodule)
        return self._run("validate", model, datamodule, {"validate": dataloaders}, ckpt_path, loops.run_eval_stage)

    def test(self, model=None, dataloaders=None, ckpt_path=None, verbose: bool = True,
             datamodule=None) -> list[dict]:
        dataloaders, datamodule = _split_datamodule(dataloaders, datamodule)
        return self._run("test", model, datamodule, {"test": dataloaders}, ckpt_path, loops.run_eval_stage)

    def predict(self, model=None, dataloaders=None, datamodule=None, return_predictions: bool | None = None,
                ckpt_path=None) -> list | None:
        """``predict_step`` over the data: a list of outputs, a list of such lists for several
        loaders, or None with ``return_predictions=False``."""
        dataloaders, datamodule = _split_datamodule(dataloaders, datamodule)
        self.return_predictions = True if return_predictions is None else bool(return_predictions)
        return self._run("predict", model, datamodule, {"predict": dataloaders}, ckpt_path, loops.run_predict)

    def save_checkpoint(self, path: str | os.PathLike) -> None:
        """Write a checkpoint (call on every rank: rank 0 writes, the others wait)."""
        checkpointing.save(self, path)

    # -- orchestration --------------------------------------------------------------------------
    def _run(self, fn: str, model, datamodule, loaders: dict, ckpt_path, loop) -> Any:
        if self.launcher is not None and self.launcher.reruns_program:  # workers run this whole program
            sys.exit(self.launcher.launch())
        if self.launcher is not None:  # workers run this call (ddp_spawn), rank 0's results come back
            return self.launcher.launch_call(self, self._run, fn, model, datamodule, loaders, ckpt_path, loop)
        model = model if model is not None else self.module
        if model is None:
            raise ConfigError(f"trainer.{fn}() needs a model")
        if not isinstance(model, TrainModule):
            raise ConfigError(f"trainer.{fn}(): the model is a {type(model).__module__}.{type(model).__qualname__}, "
                              "not a TrainModule; subclass framework.TrainModule (training_step, configure_optimizers)")
        self.state.fn, self.state.status, self.state.signal, self.state.stop_reason = fn, "running", None, None
        failed = False
        signals = None  # the fit's stop-signal handlers (trainer/signals.py), once the ranks are known
        try:
            resume_path = setup.setup(self, fn, model, datamodule, loaders, ckpt_path)
            checkpointing.restore(self, resume_path, fn)
            setup.print_summary(self, fn)
            signals = SignalCatcher(self) if fn == "fit" else None
            with signals or contextlib.nullcontext(), Heartbeat(self), \
                    torch.autograd.set_detect_anomaly(self.detect_anomaly) if self.detect_anomaly else \
                    contextlib.nullcontext():
                result = loop(self, fn)
                if fn == "fit" and self.state.stop_reason == "preempted":
                    signals.hold()  # a second signal waits for the checkpoint and the exit (until release)
            if fn == "fit" and self.state.stop_reason == "preempted":
                self.state.status = "interrupted"
                save_after_signal(self)
            else:
                self.state.status = "finished"
                if fn == "fit":
                    setup.report_where_it_went(self)
        except BaseException as exc:
            failed = True
            self.state.status = "interrupted"
            if self.hooks is not None:
                self.hooks.callbacks("on_exception", exc)
            if self.datamodule is not None:
                self.datamodule.on_exception(exc)
            record_worker_error(exc)
            self.strategy.on_exception(exc)
            raise
        finally:
            try:
                setup.teardown(self, fn, failed)
            finally:
                if signals is not None:
                    signals.release()
        if fn == "fit" and self.state.stop_reason == "preempted":
            sys.exit(0)  # stopped on a signal, with its state saved: a clean end
        return result

    def _dist_info(self) -> DistInfo:
        """Ranks from the launcher around us; a fresh ``DistInfo`` when there is none (one
        process, or fw will start the workers)."""
        if self.strategy.multi_process and self.environment.launched_externally:
            return self.environment.info()
        return DistInfo()


def _one_datamodule(given: DataModule, datamodule) -> DataModule:
    if datamodule is not None:
        raise ConfigError("a DataModule was given twice (positionally and as datamodule=); pass it once")
    return given


def _split_datamodule(dataloaders, datamodule):
    if isinstance(dataloaders, DataModule):
        return None, _one_datamodule(dataloaders, datamodule)
    return dataloaders, datamodule
