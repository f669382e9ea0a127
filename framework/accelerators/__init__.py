"""Accelerators: ``cpu``, ``cuda`` and ``auto`` (CUDA when a GPU is visible, else CPU)."""

from __future__ import annotations

from framework.accelerators.base import Accelerator, move_to_device
from framework.accelerators.cpu import CPUAccelerator
from framework.accelerators.cuda import CUDAAccelerator
from framework.errors import ConfigError, did_you_mean

ACCELERATORS: dict[str, type[Accelerator]] = {"cpu": CPUAccelerator, "cuda": CUDAAccelerator}
ALIASES = {"gpu": "cuda"}


def get_accelerator(name: str | Accelerator) -> Accelerator:
    """Resolve ``trainer.accelerator``; ``auto`` prefers CUDA."""
    if isinstance(name, Accelerator):
        return name
    key = ALIASES.get(str(name).lower(), str(name).lower())
    if key == "auto":
        return CUDAAccelerator() if CUDAAccelerator.is_available() else CPUAccelerator()
    if key not in ACCELERATORS:
        known = [*ACCELERATORS, "auto"]
        raise ConfigError(
            f"trainer.accelerator: unknown accelerator '{name}'{did_you_mean(name, known)}; "
            f"choose one of {', '.join(known)}"
        )
    cls = ACCELERATORS[key]
    if not cls.is_available():
        raise ConfigError(
            f"trainer.accelerator={name}: CUDA is not available on this machine "
            "(torch.cuda.is_available() is False); use trainer.accelerator=cpu or auto"
        )
    return cls()


__all__ = ["Accelerator", "CPUAccelerator", "CUDAAccelerator", "get_accelerator", "move_to_device"]
