"""A batch's way to the device, through Lightning's three hooks where they are overridden:
``on_before_batch_transfer(batch, dataloader_idx)``, ``transfer_batch_to_device(batch, device,
dataloader_idx)``, ``on_after_batch_transfer(batch, dataloader_idx)``. A DataModule's override
wins over the module's, as in Lightning; with none, the accelerator moves the batch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from framework.trainer.hooks import overrides

_HOOKS = ("on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer")


def batch_transfer_fn(trainer, dataloader_idx: int = 0) -> Callable[[Any], Any]:
    """``batch -> batch on this rank's device``; looked up once per loader, not per batch."""
    device, move = trainer.strategy.root_device, trainer.accelerator.batch_to_device
    before, transfer, after = (_hook(trainer, name) for name in _HOOKS)
    if before is None and transfer is None and after is None:
        return lambda batch: move(batch, device)

    def to_device(batch: Any) -> Any:
        if before is not None:
            batch = before(batch, dataloader_idx)
        batch = transfer(batch, device, dataloader_idx) if transfer is not None else move(batch, device)
        if after is not None:
            batch = after(batch, dataloader_idx)
        return batch

    return to_device


def _hook(trainer, name: str) -> Callable | None:
    from framework.data import DataModule
    from framework.module import TrainModule

    datamodule = trainer.datamodule
    if datamodule is not None and overrides(datamodule, DataModule, name):
        return getattr(datamodule, name)
    if overrides(trainer.module, TrainModule, name):
        return getattr(trainer.module, name)
    return None
