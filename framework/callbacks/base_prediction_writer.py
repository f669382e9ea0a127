"""``BasePredictionWriter``: Lightning's base for writing predictions, as Lightning calls it.

Subclass it and override ``write_on_batch_end`` (called on every rank after each predict batch)
and/or ``write_on_epoch_end`` (on every rank at the end of predict, with that rank's predictions:
one list of batch outputs, or one per loader with several, and each batch's sample indices per
loader), as for Lightning: ``super().__init__(write_interval)`` with ``"batch"`` (the default),
``"epoch"`` or ``"batch_and_epoch"``. Batch indices are known where the loader's order is fixed
(a sequential sampler, or fw's evaluation shard under DDP: each rank's samples, without the
padding Lightning's sampler adds); elsewhere they are None (per batch) and left out (per epoch).
fw's ``PredictionWriter`` is one that gathers every rank's predictions into one file.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader, SequentialSampler

from framework.callbacks.base import Callback
from framework.errors import ConfigError

if TYPE_CHECKING:
    from framework.module import TrainModule
    from framework.trainer import Trainer


class WriteInterval(str, Enum):
    """When a writer writes (Lightning's ``WriteInterval``)."""

    BATCH = "batch"
    EPOCH = "epoch"
    BATCH_AND_EPOCH = "batch_and_epoch"

    @property
    def on_batch(self) -> bool:
        return self in (WriteInterval.BATCH, WriteInterval.BATCH_AND_EPOCH)

    @property
    def on_epoch(self) -> bool:
        return self in (WriteInterval.EPOCH, WriteInterval.BATCH_AND_EPOCH)


class BasePredictionWriter(Callback):
    """Lightning's ``BasePredictionWriter`` (see the module doc)."""

    def __init__(self, write_interval: str = "batch") -> None:
        if write_interval not in [interval.value for interval in WriteInterval]:
            raise ConfigError(f"{type(self).__name__}(write_interval={write_interval!r}): use one of "
                              f"{', '.join(interval.value for interval in WriteInterval)}")
        self.interval = WriteInterval(write_interval)
        self._batch_indices: list[list[list[int]] | None] = []  # per loader: each batch's, where known
        self._predictions: list[list[Any]] = []
        self._epoch_batch_indices: list[list[list[int]]] = []

    def write_on_batch_end(self, trainer: Trainer, module: TrainModule, prediction: Any,
                           batch_indices: list[int] | None, batch: Any, batch_idx: int, dataloader_idx: int) -> None:
        raise NotImplementedError()

    def write_on_epoch_end(self, trainer: Trainer, module: TrainModule, predictions: list[Any],
                           batch_indices: list[Any]) -> None:
        raise NotImplementedError()

    def on_predict_epoch_start(self, trainer: Trainer, module: TrainModule) -> None:
        given = trainer.predict_dataloaders
        loaders = [] if given is None else list(given) if isinstance(given, list) else [given]
        self._batch_indices = [fixed_batch_indices(loader) for loader in loaders]
        self._predictions = [[] for _ in loaders]
        self._epoch_batch_indices = [[] for _ in loaders]

    def on_predict_batch_end(self, trainer: Trainer, module: TrainModule, outputs: Any, batch: Any, batch_idx: int,
                             dataloader_idx: int = 0) -> None:
        indices = self._indices_of(batch_idx, dataloader_idx)
        if self.interval.on_batch:
            self.write_on_batch_end(trainer, module, outputs, indices, batch, batch_idx, dataloader_idx)
        if self.interval.on_epoch:
            self._keep_for_epoch(dataloader_idx, indices, to_cpu(outputs))

    def _keep_for_epoch(self, dataloader_idx: int, indices: list[int] | None, outputs: Any) -> None:
        """Hold a batch's outputs (on the CPU) and its indices for ``write_on_epoch_end``."""
        self._predictions[dataloader_idx].append(outputs)
        if indices is not None:
            self._epoch_batch_indices[dataloader_idx].append(indices)

    def on_predict_epoch_end(self, trainer: Trainer, module: TrainModule) -> None:
        if not self.interval.on_epoch:
            return
        predictions = self._predictions[0] if len(self._predictions) == 1 else self._predictions
        self.write_on_epoch_end(trainer, module, predictions, self._epoch_batch_indices)
        self._predictions, self._epoch_batch_indices = [], []

    def _indices_of(self, batch_idx: int, dataloader_idx: int) -> list[int] | None:
        """The data set indices of loader ``dataloader_idx``'s batch ``batch_idx``, where known."""
        known = self._batch_indices[dataloader_idx]
        return known[batch_idx] if known is not None and batch_idx < len(known) else None


def to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, (list, tuple)):
        return type(value)(to_cpu(v) for v in value)
    if isinstance(value, dict):
        return {k: to_cpu(v) for k, v in value.items()}
    return value


def fixed_batch_indices(loader: Any) -> list[list[int]] | None:
    """The data set indices of each batch, for loaders whose order is fixed (no random draw)."""
    from framework.data import EvalShardSampler

    if not isinstance(loader, DataLoader) or loader.batch_sampler is None:
        return None
    sampler = loader.sampler
    # an evaluation shard's order is the data set's, or a custom sampler's drawn from a fixed seed
    fixed = isinstance(sampler, (SequentialSampler, EvalShardSampler))
    return [list(batch) for batch in loader.batch_sampler] if fixed else None
