"""Measure training throughput: batches and samples per second over a sliding window.

Logged every ``trainer.log_every_n_steps`` optimizer steps (every step if the Trainer has no such
setting) as ``throughput/batches_per_sec`` and ``throughput/samples_per_sec`` (global: this
rank's samples times the world size, as every rank runs the same per-rank batch). Timing is
host-side and unsynchronised; over a window of many batches, queued device work evens out.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from framework.callbacks.base import Callback
from framework.counting import every
from framework.errors import ConfigError

if TYPE_CHECKING:
    from framework.module import TrainModule
    from framework.trainer import Trainer


def default_batch_size(batch: Any) -> int:
    """The leading dimension of the first tensor found in ``batch`` (1 if there is none)."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() > 0 else 1
    if isinstance(batch, Mapping):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        for item in batch:
            size = default_batch_size(item)
            if size != 1 or isinstance(item, torch.Tensor):
                return size
    return 1


class ThroughputMonitor(Callback):
    """Log batches/s and samples/s during training.

    Args:
        batch_size_fn: ``batch -> number of samples``; default: leading dim of the first tensor.
        window: Number of recent batches the rates are averaged over.
    """

    def __init__(self, batch_size_fn: Callable[[Any], int] | None = None, window: int = 50) -> None:
        if window < 1:
            raise ConfigError(f"ThroughputMonitor(window={window}) must be >= 1")
        self.batch_size_fn = batch_size_fn or default_batch_size
        self.window = window
        self._times: deque[float] = deque(maxlen=window + 1)
        self._samples: deque[int] = deque(maxlen=window + 1)
        self._last_step_logged = -1

    def on_train_epoch_start(self, trainer: Trainer, module: TrainModule) -> None:
        # The gap between epochs (validation, checkpointing) is not training time.
        self._times.clear()
        self._samples.clear()
        self._times.append(time.perf_counter())
        self._samples.append(0)

    def on_train_batch_end(self, trainer: Trainer, module: TrainModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self._times.append(time.perf_counter())
        self._samples.append(self.batch_size_fn(batch))
        step = trainer.global_step
        interval = max(1, getattr(trainer, "log_every_n_steps", 1))
        if len(self._times) < 2 or step == self._last_step_logged or not every(interval, step):
            return
        self._last_step_logged = step
        elapsed = self._times[-1] - self._times[0]
        if elapsed <= 0:
            return
        batches = len(self._times) - 1
        samples = sum(list(self._samples)[1:])
        trainer.log_metrics({
            "throughput/batches_per_sec": batches / elapsed,
            "throughput/samples_per_sec": samples * trainer.world_size / elapsed,
        }, step=step)
