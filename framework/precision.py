"""Numeric precision: ``32`` (float32), ``bf16-mixed`` (autocast to bfloat16) and ``16-mixed``
(autocast to float16 with a GradScaler so small gradients do not underflow)."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from framework.errors import ConfigError

_ALIASES = {
    "32": "32", "32-true": "32", "fp32": "32",
    "bf16-mixed": "bf16-mixed", "bf16": "bf16-mixed",
    "16-mixed": "16-mixed", "16": "16-mixed", "fp16": "16-mixed",
}


def normalize_precision(value: Any) -> str:
    key = str(value).lower()
    if key not in _ALIASES:
        raise ConfigError(f"trainer.precision: unknown precision '{value}'; use 32, bf16-mixed or 16-mixed")
    return _ALIASES[key]


class Precision:
    """Autocast for forward passes, and scaled backward/step for ``16-mixed``."""

    def __init__(self, precision: Any, device_type: str) -> None:
        self.precision = normalize_precision(precision)
        self.device_type = device_type
        self.scaler: torch.amp.GradScaler | None = None
        if self.precision == "16-mixed":
            self.scaler = torch.amp.GradScaler(device_type)
        dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(self.precision)
        self.autocast_dtype = dtype

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.autocast_dtype)

    def backward(self, loss: torch.Tensor) -> None:
        if self.scaler is not None:
            loss = self.scaler.scale(loss)
        loss.backward()

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Bring gradients to their true scale before clipping or inspecting them."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer, **kwargs: Any) -> None:
        if self.scaler is None:
            optimizer.step(**kwargs)
            return
        self.scaler.step(optimizer, **kwargs)
        self.scaler.update()

    def state_dict(self) -> dict:
        return self.scaler.state_dict() if self.scaler is not None else {}

    def load_state_dict(self, state: dict) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)
