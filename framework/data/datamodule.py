"""``DataModule``: a run's data in one object, and the batch size that weights logged means."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader


class DataModule:
    """Owns the data of a run: download once, split, build loaders.

    ``prepare_data`` runs on global rank 0 only (download, write files); ``setup(stage)`` runs on
    every rank (``stage`` is ``fit``, ``validate``, ``test`` or ``predict``).
    """

    def prepare_data(self) -> None: ...

    def setup(self, stage: str) -> None: ...

    def teardown(self, stage: str) -> None:
        """After ``fit``/``validate``/``test``/``predict`` (not after a failure: ``on_exception``)."""

    def on_exception(self, exception: BaseException) -> None:
        """A run failed with ``exception`` (before it goes on to the caller)."""

    def train_dataloader(self) -> DataLoader:
        raise NotImplementedError(f"{type(self).__name__} has no train_dataloader()")

    def val_dataloader(self) -> DataLoader | None:
        return None

    def test_dataloader(self) -> DataLoader | None:
        return None

    def predict_dataloader(self) -> DataLoader | None:
        return None

    # -- batch transfer: an override here wins over the module's, as in Lightning -------------
    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        return batch

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        from framework.accelerators.base import move_to_device

        return move_to_device(batch, device)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        return batch

    # -- checkpoints: what ``state_dict`` returns is saved and handed back on resume ----------
    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None: ...


def batch_size_of(batch: Any) -> int:
    """Size of the first dimension of the first tensor in ``batch`` (1 if none)."""
    if isinstance(batch, torch.Tensor):
        return batch.shape[0] if batch.dim() else 1
    if isinstance(batch, (list, tuple)):
        for item in batch:
            return batch_size_of(item)
    if isinstance(batch, dict):
        for item in batch.values():
            return batch_size_of(item)
    return 1
