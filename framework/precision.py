"""Numeric precision, with Lightning's names: ``32-true`` (float32), ``64-true``, ``bf16-true`` and
``16-true`` (the weights, the float inputs and the tensors made in a step in that dtype),
``bf16-mixed`` (autocast to bfloat16) and ``16-mixed`` (autocast to float16 with a GradScaler so
small gradients do not underflow)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from framework.errors import ConfigError

_ALIASES = {
    "32": "32-true", "32-true": "32-true", "fp32": "32-true",
    "64": "64-true", "64-true": "64-true", "double": "64-true",
    "bf16-true": "bf16-true", "16-true": "16-true",
    "bf16-mixed": "bf16-mixed", "bf16": "bf16-mixed",
    "16-mixed": "16-mixed", "16": "16-mixed", "fp16": "16-mixed",
}
_TRUE_DTYPES = {"64-true": torch.float64, "bf16-true": torch.bfloat16, "16-true": torch.float16}


def normalize_precision(value: Any) -> str:
    """Lightning's name of a precision (``32`` -> ``32-true``, ``bf16`` -> ``bf16-mixed``)."""
    key = str(value).lower()
    if key not in _ALIASES:
        raise ConfigError(f"trainer.precision: unknown precision '{value}'; use one of 32-true, 64-true, bf16-mixed, "
                          "16-mixed, bf16-true, 16-true")
    return _ALIASES[key]


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Tensors made inside (``torch.zeros(3)``, a new ``nn.Linear``) are ``dtype``."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def convert_floats(data: Any, dtype: torch.dtype) -> Any:
    """``data`` (tensors in lists, tuples and dicts) with its floating-point tensors in ``dtype``."""
    if isinstance(data, torch.Tensor):
        return data.to(dtype) if data.is_floating_point() else data
    if isinstance(data, dict):
        return type(data)((k, convert_floats(v, dtype)) for k, v in data.items())
    if isinstance(data, tuple) and hasattr(data, "_fields"):  # a namedtuple
        return type(data)(*(convert_floats(v, dtype) for v in data))
    if isinstance(data, (list, tuple)):
        return type(data)(convert_floats(v, dtype) for v in data)
    return data


class Precision:
    """What a precision does to a run (Lightning's ``trainer.precision_plugin``): the module's
    dtype (``convert_module``), the batches' (``convert_input``), the context of each step
    (``forward_context``: autocast, or the default dtype), and scaled backward/step for
    ``16-mixed``."""

    def __init__(self, precision: Any, device_type: str) -> None:
        self.precision = normalize_precision(precision)
        self.device_type = device_type
        self.scaler: torch.amp.GradScaler | None = None
        if self.precision == "16-mixed":
            self.scaler = torch.amp.GradScaler(device_type)
        self.autocast_dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(self.precision)
        #: the dtype of the weights, the inputs and new tensors under a "-true" precision other than 32
        self.true_dtype = _TRUE_DTYPES.get(self.precision)
        #: whether a step runs inside ``forward_context()`` (else the loops skip entering it)
        self.has_forward_context = self.autocast_dtype is not None or self.true_dtype is not None

    def forward_context(self) -> contextlib.AbstractContextManager:
        """Around each training/evaluation/prediction step."""
        if self.autocast_dtype is not None:
            return torch.autocast(self.device_type, dtype=self.autocast_dtype)
        if self.true_dtype is not None:
            return default_dtype(self.true_dtype)
        return contextlib.nullcontext()

    def init_context(self) -> contextlib.AbstractContextManager:
        """Around ``configure_model``: layers built there are made in the run's dtype."""
        return default_dtype(self.true_dtype) if self.true_dtype is not None else contextlib.nullcontext()

    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        return module.to(dtype=self.true_dtype) if self.true_dtype is not None else module

    def convert_input(self, batch: Any) -> Any:
        return convert_floats(batch, self.true_dtype) if self.true_dtype is not None else batch

    def converting(self, step: Callable[..., Any]) -> Callable[..., Any]:
        """``step`` called with its float inputs converted (``convert_input``), as Lightning's
        strategy does to a step's arguments; the batch hooks still see the batch as it came."""
        if self.true_dtype is None:
            return step
        return lambda *args: step(*self.convert_input(args))

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
