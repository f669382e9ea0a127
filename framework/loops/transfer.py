"""A batch's way to the device, through Lightning's three hooks where they are overridden:
``on_before_batch_transfer(batch, dataloader_idx)``, ``transfer_batch_to_device(batch, device,
dataloader_idx)``, ``on_after_batch_transfer(batch, dataloader_idx)``. A DataModule's override
wins over the module's, as in Lightning; with none, the accelerator moves the batch."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from framework.loops.hooks import overrides

if TYPE_CHECKING:
    from framework.trainer.run import Run

_HOOKS = ("on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer")


def batch_transfer_fn(run: Run, dataloader_idx: int = 0) -> Callable[[Any], Any] | None:
    """``batch -> batch on this rank's device``; looked up once per loader, not per batch. None
    where nothing would touch a batch: no hook, an accelerator that leaves batches as they are
    (the CPU), and no profiler to record the move."""
    device, move = run.strategy.root_device, run.accelerator.batch_to_device
    before, transfer, after = (_hook(run, name) for name in _HOOKS)
    if before is None and transfer is None and after is None:
        if not run.accelerator.moves_batches and run.hooks.profiler is None:
            return None
        return run.hooks.strategy_fn("batch_to_device", lambda batch: move(batch, device))

    def to_device(batch: Any) -> Any:
        if before is not None:
            batch = before(batch, dataloader_idx)
        batch = transfer(batch, device, dataloader_idx) if transfer is not None else move(batch, device)
        if after is not None:
            batch = after(batch, dataloader_idx)
        return batch

    return run.hooks.strategy_fn("batch_to_device", to_device)  # Lightning's action: the three hooks inside


def _hook(run: Run, name: str) -> Callable | None:
    from framework.data import DataModule
    from framework.module import TrainModule

    datamodule = run.datamodule
    if datamodule is not None and overrides(datamodule, DataModule, name):
        return run.hooks.timed(f"[LightningDataModule]{type(datamodule).__name__}.{name}", getattr(datamodule, name))
    if overrides(run.module, TrainModule, name):
        return run.hooks.module_fn(name)
    return None
