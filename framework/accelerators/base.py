"""The accelerator: which device a rank uses and how a batch gets there."""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from typing import Any

import torch


class Accelerator(ABC):
    """Owns device choice and batch transfer; strategies ask it, never torch.cuda directly."""

    name: str = ""
    #: Does ``batch_to_device`` change a batch? (The CPU's leaves it as the loader made it.)
    moves_batches = True

    @staticmethod
    @abstractmethod
    def is_available() -> bool: ...

    @staticmethod
    @abstractmethod
    def device_count() -> int: ...

    @abstractmethod
    def device_for(self, local_index: int) -> torch.device:
        """The device of the ``local_index``-th device used on this node."""

    def setup_device(self, device: torch.device) -> None:
        """Make ``device`` current for this process (CUDA: ``torch.cuda.set_device``)."""

    def batch_to_device(self, batch: Any, device: torch.device) -> Any:
        return move_to_device(batch, device, non_blocking=False)


def move_to_device(batch: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """Move every tensor in tuples, lists, dicts and dataclasses to ``device``.

    A tensor already on ``device`` is returned as it is (no copy, no allocation).
    """
    if isinstance(batch, torch.Tensor):
        if batch.device == device:
            return batch
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, (list, tuple)):
        moved = [move_to_device(x, device, non_blocking) for x in batch]
        if hasattr(batch, "_fields"):  # namedtuple
            return type(batch)(*moved)
        return type(batch)(moved) if isinstance(batch, tuple) else moved
    if isinstance(batch, dict):
        return type(batch)((k, move_to_device(v, device, non_blocking)) for k, v in batch.items())
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        changes = {
            f.name: move_to_device(getattr(batch, f.name), device, non_blocking)
            for f in dataclasses.fields(batch)
            if f.init
        }
        return dataclasses.replace(batch, **changes)
    if hasattr(batch, "to") and callable(batch.to) and not isinstance(batch, type):
        try:
            return batch.to(device)
        except TypeError:
            return batch
    return batch
