"""The CUDA accelerator: one GPU per local rank (``cuda:<local rank>``), batches copied there
without blocking from pinned host memory."""

from __future__ import annotations

from typing import Any

import torch

from framework.accelerators.base import Accelerator, move_to_device


class CUDAAccelerator(Accelerator):
    """CUDA: rank with local index i uses ``cuda:i``; host batches in pinned memory move
    with ``non_blocking=True`` so the copy overlaps with compute."""

    name = "cuda"

    @staticmethod
    def is_available() -> bool:
        return torch.cuda.is_available()

    @staticmethod
    def device_count() -> int:
        return torch.cuda.device_count()

    def device_for(self, local_index: int) -> torch.device:
        return torch.device("cuda", local_index)

    def setup_device(self, device: torch.device) -> None:
        torch.cuda.set_device(device)

    def batch_to_device(self, batch: Any, device: torch.device) -> Any:
        return move_to_device(batch, device, non_blocking=True)
