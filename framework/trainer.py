"""The Trainer: builds the parts of a run from its arguments and drives the loops.

It owns its accelerator, strategy, precision, callbacks and loggers and passes them what they
need; the loops themselves live in ``framework.loops`` and the checkpoint contents in
``framework.trainer_state``.
"""

from __future__ import annotations

import math
import os
import sys
from typing import Any

import torch

from framework import eval_loop, launch, loops, trainer_state
from framework.accelerators import get_accelerator
from framework.callbacks.base import Callback
from framework.data import DataModule, batch_size_of
from framework.environments import DistInfo, detect_environment
from framework.errors import ConfigError
from framework.hooks import HookDispatcher
from framework.precision import Precision
from framework.results import MetricCollector
from framework.strategies import Strategy, create_strategy
from framework.trainer_args import (
    as_list, check_callbacks, check_val_check_interval, default_strategy, limit_arg, parse_devices,
    parse_max_time, positive_int,
)


class Trainer:
    """Runs fit/validate/test/predict for a ``TrainModule``. Keyword names follow Lightning's.

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
        gradient_clip_val, gradient_clip_algorithm: clip by ``norm`` (default) or ``value``.
        val_check_interval: validate every N train batches (int) or fraction of an epoch.
        check_val_every_n_epoch, num_sanity_val_steps, log_every_n_steps: as in Lightning.
        limit_{train,val,test,predict}_batches: int (batches) or float (fraction).
        callbacks, logger: callbacks list; logger ``True`` (TensorBoard), ``False``, a Logger
            or a list.
        enable_checkpointing, enable_progress_bar: add the default ModelCheckpoint /
            progress bar unless one was given.
        default_root_dir: where logs and checkpoints go (default: the working directory).
        deterministic: ``torch.use_deterministic_algorithms``.
        max_restarts, rdzv_endpoint: passed to the elastic agent when fw launches workers.
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
        gradient_clip_algorithm: str = "norm",
        deterministic: bool = False,
        default_root_dir: str | None = None,
        max_restarts: int = 0,
        rdzv_endpoint: str | None = None,
    ) -> None:
        self.accelerator = get_accelerator(accelerator)
        self.num_nodes = positive_int("num_nodes", num_nodes)
        self._env = detect_environment()
        launched = self._env.info() if self._env.launched_externally else None
        if launched is not None and devices == "auto" and self.accelerator.name == "cpu":
            devices = launched.local_world_size  # one CPU process per launched task
        self.devices = parse_devices(devices, self.accelerator)
        self.strategy: Strategy = create_strategy(
            default_strategy(strategy, len(self.devices) * self.num_nodes), self.accelerator.name
        )
        if not self.strategy.multi_process and self.num_nodes > 1:
            raise ConfigError(f"trainer.num_nodes={num_nodes} needs a multi-process strategy (ddp, mpi)")
        if self.strategy.name == "single" and len(self.devices) > 1:
            raise ConfigError(
                f"trainer.strategy=single uses one device but trainer.devices={devices}; "
                "set trainer.devices=1, or pick ddp (one process per device) or dp"
            )
        if launched is not None and launched.world_size > 1 and not self.strategy.multi_process:
            raise ConfigError(
                f"{launched.source} started {launched.world_size} processes but trainer.strategy="
                f"{self.strategy.name} runs in one: each would train alone. Set trainer.strategy=ddp "
                f"(or mpi under mpiexec) and trainer.devices={launched.local_world_size}"
            )
        self._needs_launch = False
        self.strategy.connect(self.accelerator, self._resolve_dist(), self.devices)
        self.precision = Precision(precision, self.accelerator.name)

        if max_epochs is None and max_steps == -1 and max_time is None:
            max_epochs = 1000
        self.max_epochs = max_epochs if max_epochs is not None else -1
        self.min_epochs = min_epochs or 0
        self.max_steps = int(max_steps)
        self.max_time = parse_max_time(max_time)
        self.limits = {
            "train": limit_arg("limit_train_batches", limit_train_batches),
            "validate": limit_arg("limit_val_batches", limit_val_batches),
            "test": limit_arg("limit_test_batches", limit_test_batches),
            "predict": limit_arg("limit_predict_batches", limit_predict_batches),
        }
        self.val_check_interval = check_val_check_interval(val_check_interval)
        if check_val_every_n_epoch is not None:
            positive_int("check_val_every_n_epoch", check_val_every_n_epoch)
        self.check_val_every_n_epoch = check_val_every_n_epoch
        self.num_sanity_val_steps = int(num_sanity_val_steps)
        self.log_every_n_steps = positive_int("log_every_n_steps", log_every_n_steps)
        self.accumulate_grad_batches = positive_int("accumulate_grad_batches", accumulate_grad_batches)
        if gradient_clip_algorithm not in ("norm", "value"):
            raise ConfigError(f"trainer.gradient_clip_algorithm '{gradient_clip_algorithm}': use norm or value")
        self.gradient_clip_val = gradient_clip_val
        self.gradient_clip_algorithm = gradient_clip_algorithm
        self.default_root_dir = os.fspath(default_root_dir) if default_root_dir else os.getcwd()
        self.max_restarts, self.rdzv_endpoint = int(max_restarts), rdzv_endpoint
        if deterministic:
            torch.use_deterministic_algorithms(True)
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

        self.callbacks = trainer_state.default_callbacks(
            check_callbacks(as_list(callbacks)), enable_checkpointing, enable_progress_bar
        )
        self.loggers = trainer_state.resolve_loggers(logger)
        self.log_dir: str | None = None

        # progress of the run (saved in checkpoints)
        self.current_epoch = 0
        self.global_step = 0
        self.should_stop = False
        self.sanity_checking = False
        self.training = False
        self.stage: str | None = None
        self.num_training_batches: float = math.inf
        self.num_val_batches = 0
        self.optimizers: list[torch.optim.Optimizer] = []
        self.lr_scheduler_configs: list = []
        self.module = None
        self.datamodule: DataModule | None = None
        self._collector = MetricCollector("train", self._current_batch_size)
        self._current_batch: Any = None
        self._epoch_metrics: dict[str, torch.Tensor] = {}
        self._prog_bar_keys: dict[str, bool] = {}  # epoch metric -> shown in the progress bar
        self._hooks = HookDispatcher(self.callbacks, self)
        self._recipe_text: str | None = None
        self._loaders: dict[str, list] = {}
        self._loop_position = {"epoch": 0, "batches_done": 0, "epoch_finished": False}
        self._epoch_start_rng: dict | None = None
        self._resume: dict | None = None

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

    # -- metrics --------------------------------------------------------------------------------
    @property
    def callback_metrics(self) -> dict[str, torch.Tensor]:
        return {**self._collector.step_values(), **self._epoch_metrics}

    @property
    def logged_metrics(self) -> dict[str, torch.Tensor]:
        return self.callback_metrics

    @property
    def progress_bar_metrics(self) -> dict[str, float]:
        values = self._collector.step_values_for("prog_bar")
        values.update({k: v for k, v in self._epoch_metrics.items() if self._prog_bar_keys.get(k)})
        return {k: float(v) for k, v in values.items() if v.numel() == 1}

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Send ``metrics`` to every logger (rank 0 only; other ranks do nothing)."""
        if not self.is_global_zero or not metrics:
            return
        for lg in self.loggers:
            lg.log_metrics(metrics, step)

    def _current_batch_size(self) -> int:
        return batch_size_of(self._current_batch)

    # -- public API -----------------------------------------------------------------------------
    def fit(self, model, train_dataloaders=None, val_dataloaders=None, datamodule=None, ckpt_path=None) -> None:
        """Train ``model``; ``ckpt_path`` (a path or ``"last"``) resumes from a checkpoint."""
        self._run("fit", model, datamodule, {"train": train_dataloaders, "validate": val_dataloaders},
                  ckpt_path, loops.run_fit)

    def validate(self, model=None, dataloaders=None, datamodule=None, ckpt_path=None) -> list[dict]:
        return self._run("validate", model, datamodule, {"validate": dataloaders}, ckpt_path, eval_loop.run_eval_stage)

    def test(self, model=None, dataloaders=None, datamodule=None, ckpt_path=None) -> list[dict]:
        return self._run("test", model, datamodule, {"test": dataloaders}, ckpt_path, eval_loop.run_eval_stage)

    def predict(self, model=None, dataloaders=None, datamodule=None, ckpt_path=None) -> list:
        return self._run("predict", model, datamodule, {"predict": dataloaders}, ckpt_path, eval_loop.run_predict)

    def save_checkpoint(self, path: str | os.PathLike) -> None:
        """Write a checkpoint (call on every rank: rank 0 writes, the others wait)."""
        trainer_state.save(self, path)

    # -- orchestration --------------------------------------------------------------------------
    def _run(self, stage: str, model, datamodule, loaders: dict, ckpt_path, body) -> Any:
        self._launch_if_needed()
        model = model if model is not None else self.module
        if model is None:
            raise ConfigError(f"trainer.{stage}() needs a model")
        self.stage = stage
        failed = False
        try:
            trainer_state.setup(self, stage, model, datamodule, loaders)
            checkpoint = trainer_state.restore(self, ckpt_path, stage)
            return body(self, stage, checkpoint)
        except BaseException as exc:
            failed = True
            self._hooks("on_exception", exc)
            launch.record_worker_error(exc)
            self.strategy.on_exception(exc)
            raise
        finally:
            trainer_state.teardown(self, stage, failed)

    def _resolve_dist(self) -> DistInfo:
        """Ranks from the launcher around us, or (if fw must start workers) this node's plan."""
        world = len(self.devices) * self.num_nodes
        if not self.strategy.multi_process:
            return DistInfo()
        if self._env.launched_externally:
            info = self._env.info()
            launch.check_world(info, len(self.devices), self.num_nodes, self.strategy.name)
            return info
        launch.check_not_inside_batch_script(world)
        self._needs_launch = world > 1
        return DistInfo()

    def _launch_if_needed(self) -> None:
        """Without a launcher around: start the workers, wait for them, and exit with their status
        (the workers run this whole program; this process does not train)."""
        if not self._needs_launch:
            return
        if self.strategy.name == "mpi":
            raise ConfigError(
                f"trainer.strategy=mpi with {len(self.devices) * self.num_nodes} processes needs an "
                f"MPI launcher: mpiexec -n {len(self.devices) * self.num_nodes} fw fit ... "
                "(or set trainer.devices=1)"
            )
        code = launch.launch_workers(
            nproc_per_node=len(self.devices), num_nodes=self.num_nodes,
            max_restarts=self.max_restarts, rdzv_endpoint=self.rdzv_endpoint,
            socket_ifname=getattr(self.strategy, "socket_ifname", None),
        )
        sys.exit(code)
