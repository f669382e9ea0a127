"""``ModelSummary``: the model's layers as a table at the start of a fit, down to ``max_depth``, as
Lightning's callback (stderr, rank 0). Given, it replaces the summary ``enable_model_summary``
prints (and prints even where that is off, as in Lightning).

The table (``print_model_summary``, which the Trainer prints for ``enable_model_summary``) is
Lightning's: each layer with its type, parameter count and mode, and its input and output shapes
when the module sets ``example_input_array``; then trainable, non-trainable and total parameters
and their size."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from framework.callbacks.base import Callback
from framework.errors import ConfigError

if TYPE_CHECKING:
    from framework.module import TrainModule
    from framework.trainer import Trainer


class ModelSummary(Callback):
    """``max_depth``: 1 the module's direct children, 2 theirs too, -1 every layer, 0 no summary."""

    def __init__(self, max_depth: int = 1, **summarize_kwargs: Any) -> None:
        if not isinstance(max_depth, int) or max_depth < -1:
            raise ConfigError(f"ModelSummary(max_depth={max_depth!r}) must be an int >= -1 (-1: every layer)")
        if summarize_kwargs:
            raise ConfigError(f"ModelSummary({', '.join(summarize_kwargs)}=...): fw's summary takes max_depth alone")
        self._max_depth = max_depth

    def on_fit_start(self, trainer: Trainer, module: TrainModule) -> None:
        if self._max_depth == 0 or not trainer.is_global_zero:
            return
        print_model_summary(module, self._max_depth)


# -- the table --------------------------------------------------------------------------------------
def layer_rows(module: nn.Module, max_depth: int = 1) -> list[dict[str, Any]]:
    """One row per layer down to ``max_depth`` (1: the direct children; -1: all, as Lightning's
    ``ModelSummary``): name, type, parameters, mode, and shapes (``"?"`` unknown)."""
    rows = [{"name": name, "type": type(child).__name__, "params": sum(p.numel() for p in child.parameters()),
             "mode": "train" if child.training else "eval", "in": "?", "out": "?"}
            for name, child in module.named_modules()
            if name and (max_depth < 0 or name.count(".") < max_depth)]
    example = getattr(module, "example_input_array", None)
    if example is not None and rows:
        _record_shapes(module, example, rows)
    return rows


def _record_shapes(module: nn.Module, example: Any, rows: list[dict]) -> None:
    layers = dict(module.named_modules())
    hooks = []
    for row in rows:
        def hook(_mod, inputs, output, row=row):
            row["in"], row["out"] = _shape(inputs[0] if len(inputs) == 1 else inputs), _shape(output)
        hooks.append(layers[row["name"]].register_forward_hook(hook))
    was_training = module.training
    device = next((p.device for p in module.parameters()), torch.device("cpu"))
    try:
        module.eval()
        with torch.no_grad():
            inputs = _to(example, device)
            module(*inputs) if isinstance(inputs, tuple) else module(**inputs) if isinstance(inputs, dict) \
                else module(inputs)
    finally:
        module.train(was_training)
        for h in hooks:
            h.remove()


def _to(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(_to(v, device) for v in value)
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    return value


def _shape(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return str(list(value.shape))
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_shape(v) for v in value) + "]"
    return "?"


def short_count(n: int, units: tuple[str, str, str] = ("B", "M", "K"), ones: str = "") -> str:
    """``n`` with one decimal in the largest unit it reaches (billions, millions, thousands)."""
    for unit, size in zip(units, (1e9, 1e6, 1e3), strict=True):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} {ones}" if ones else str(n)


def print_model_summary(module: nn.Module, max_depth: int = 1) -> None:
    """The table on stderr: one row per layer down to ``max_depth``, then the parameter counts and size."""
    from rich.console import Console
    from rich.table import Table

    rows = layer_rows(module, max_depth)
    shapes = any(row["in"] != "?" for row in rows)
    table = Table(title=f"{type(module).__name__}", title_justify="left")
    for column in ["", "Name", "Type", "Params", "Mode"] + (["In sizes", "Out sizes"] if shapes else []):
        table.add_column(column, justify="right" if column == "Params" else "left")
    for i, row in enumerate(rows):
        cells = [str(i), row["name"], row["type"], short_count(row["params"]), row["mode"]]
        table.add_row(*cells + ([row["in"], row["out"]] if shapes else []))
    params = list(module.parameters())
    trainable = sum(p.numel() for p in params if p.requires_grad)
    total = sum(p.numel() for p in params)
    size_mb = sum(p.numel() * p.element_size() for p in params) / 1e6
    console = Console(stderr=True)
    console.print(table)
    console.print(f"{short_count(trainable)} trainable params, {short_count(total - trainable)} non-trainable params, "
                  f"{short_count(total)} total params, {size_mb:.3f} MB")
