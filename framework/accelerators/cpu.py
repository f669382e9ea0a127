from __future__ import annotations

import os

import torch

from framework.accelerators.base import Accelerator


class CPUAccelerator(Accelerator):
    """CPU: every rank uses ``cpu``; batches already on the CPU are passed through untouched."""

    name = "cpu"

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def device_count() -> int:
        return os.cpu_count() or 1

    def device_for(self, local_index: int) -> torch.device:
        return torch.device("cpu")
