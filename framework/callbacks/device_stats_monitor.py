"""Log the device's statistics at the training, validation and test batches (Lightning's ``DeviceStatsMonitor``).

What is logged, under ``DeviceStatsMonitor.<hook>/<name>`` (``<hook>``: ``on_train_batch_start``,
``on_train_batch_end``, ``on_validation_batch_start``, ... ; a subclass logs under its own name):

- on the CPU (``psutil``): ``cpu_percent`` (system-wide CPU use since the last reading),
  ``cpu_vm_percent`` (memory in use), ``cpu_swap_percent`` (swap in use);
- on a CUDA device: ``torch.cuda.memory_stats`` (the caching allocator's counters, in bytes).

``cpu_stats=None`` logs CPU statistics when the run is on the CPU, ``True`` on any device (beside
the GPU's), ``False`` never. Rows go to the Trainer's loggers (rank 0 writes) at the batches where
Lightning writes them: in training every ``log_every_n_steps`` batches that stepped (and when a
stop was asked for), at the step the logged rows carry; in evaluation every ``log_every_n_steps``
batches of the stage (counted over its loaders).
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

import torch

from framework.callbacks.base import Callback
from framework.errors import ConfigError, require_package

if TYPE_CHECKING:
    from framework.module import TrainModule
    from framework.trainer import Trainer


def cpu_stats() -> dict[str, float]:
    """The CPU and memory use, from psutil (Lightning's keys)."""
    psutil: Any = importlib.import_module("psutil")  # an optional package, imported when used

    return {"cpu_vm_percent": psutil.virtual_memory().percent, "cpu_percent": psutil.cpu_percent(),
            "cpu_swap_percent": psutil.swap_memory().percent}


def device_stats(device: torch.device) -> dict[str, Any]:
    """What the accelerator tells of ``device``: its allocator's counters on CUDA, psutil's on the CPU."""
    if device.type == "cuda":
        return dict(torch.cuda.memory_stats(device))
    return cpu_stats()


class DeviceStatsMonitor(Callback):
    """Log device statistics through the Trainer's loggers.

    Args:
        cpu_stats: None: CPU statistics when the run is on the CPU; True: also beside a GPU's;
            False: none.

    Raises:
        ConfigError: at fit set-up, when the Trainer has no logger.
        ModuleNotFoundError: at fit set-up, when CPU statistics are due and psutil is not installed.
    """

    def __init__(self, cpu_stats: bool | None = None) -> None:
        self._cpu_stats = cpu_stats
        self._step_at_batch_start = 0  # Lightning's batches-that-stepped count during this batch
        self._eval_batches = 0  # the batches of the running evaluation stage, over its loaders

    def setup(self, trainer: Trainer, module: TrainModule, stage: str) -> None:
        if stage != "fit":
            return
        if not trainer.loggers:
            raise ConfigError("DeviceStatsMonitor needs a logger, and the Trainer has none (logger=False): give it one, "
                              "e.g. Trainer(logger=framework.loggers.CSVLogger('logs'))")
        on_cpu = trainer.strategy.root_device.type == "cpu"
        if self._cpu_stats is not False and (on_cpu or self._cpu_stats):
            require_package("psutil", "DeviceStatsMonitor (its CPU statistics)",
                            "pip install psutil (or DeviceStatsMonitor(cpu_stats=False) on a GPU)")

    def _log(self, trainer: Trainer, hook: str, count: int, step: int) -> None:
        """Log when ``count`` (Lightning's counter for this batch) falls on ``log_every_n_steps``."""
        n = trainer.log_every_n_steps
        if not n or (count % n != 0 and not trainer.should_stop):  # 0: never, as in Lightning
            return
        device = trainer.strategy.root_device
        if self._cpu_stats is False and device.type == "cpu":
            return
        stats = device_stats(device)
        if self._cpu_stats and device.type != "cpu":
            stats.update(cpu_stats())
        prefix = f"{type(self).__qualname__}.{hook}/"
        trainer.log_metrics({prefix + name: value for name, value in stats.items()}, step=step)

    # -- training: Lightning counts the batches that stepped after a batch's hooks -----------------
    def on_train_batch_start(self, trainer: Trainer, module: TrainModule, batch: Any, batch_idx: int) -> None:
        self._step_at_batch_start = trainer.state.batches_that_stepped
        self._log(trainer, "on_train_batch_start", self._step_at_batch_start + 1, self._step_at_batch_start)

    def on_train_batch_end(self, trainer: Trainer, module: TrainModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self._log(trainer, "on_train_batch_end", self._step_at_batch_start + 1, self._step_at_batch_start)

    # -- evaluation --------------------------------------------------------------------------------
    def _eval_start(self, trainer: Trainer, module: TrainModule) -> None:
        self._eval_batches = 0

    on_validation_start = on_test_start = _eval_start

    def _eval_batch(self, trainer: Trainer, hook: str, starts: bool) -> None:
        self._eval_batches += starts
        self._log(trainer, hook, self._eval_batches, trainer.state.logger_step)

    def on_validation_batch_start(self, trainer: Trainer, module: TrainModule, batch: Any, batch_idx: int,
                                  dataloader_idx: int = 0) -> None:
        self._eval_batch(trainer, "on_validation_batch_start", starts=True)

    def on_validation_batch_end(self, trainer: Trainer, module: TrainModule, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_batch(trainer, "on_validation_batch_end", starts=False)

    def on_test_batch_start(self, trainer: Trainer, module: TrainModule, batch: Any, batch_idx: int,
                            dataloader_idx: int = 0) -> None:
        self._eval_batch(trainer, "on_test_batch_start", starts=True)

    def on_test_batch_end(self, trainer: Trainer, module: TrainModule, outputs: Any, batch: Any,
                          batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_batch(trainer, "on_test_batch_end", starts=False)
