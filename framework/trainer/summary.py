"""The tables a run shows, as Lightning's, on stderr (rank 0 only): the model summary at the
start of a fit (``enable_model_summary``: each top-level layer with its type, parameter count and
mode, and its input and output shapes when the module sets ``example_input_array``; then
trainable, non-trainable and total parameters and their size), and the results of ``validate``
and ``test`` (``verbose=True``: each logged metric per loader)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


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


def _count(n: int, units: tuple[str, str, str] = ("B", "M", "K"), ones: str = "") -> str:
    """``n`` with one decimal in the largest unit it reaches (billions, millions, thousands)."""
    for unit, size in zip(units, (1e9, 1e6, 1e3), strict=True):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} {ones}" if ones else str(n)


def print_model_summary(module: nn.Module, max_depth: int = 1) -> None:
    from rich.console import Console
    from rich.table import Table

    rows = layer_rows(module, max_depth)
    shapes = any(row["in"] != "?" for row in rows)
    table = Table(title=f"{type(module).__name__}", title_justify="left")
    for column in ["", "Name", "Type", "Params", "Mode"] + (["In sizes", "Out sizes"] if shapes else []):
        table.add_column(column, justify="right" if column == "Params" else "left")
    for i, row in enumerate(rows):
        cells = [str(i), row["name"], row["type"], _count(row["params"]), row["mode"]]
        table.add_row(*cells + ([row["in"], row["out"]] if shapes else []))
    params = list(module.parameters())
    trainable = sum(p.numel() for p in params if p.requires_grad)
    total = sum(p.numel() for p in params)
    size_mb = sum(p.numel() * p.element_size() for p in params) / 1e6
    console = Console(stderr=True)
    console.print(table)
    console.print(f"{_count(trainable)} trainable params, {_count(total - trainable)} non-trainable params, "
                  f"{_count(total)} total params, {size_mb:.3f} MB")


def print_results(fn: str, results: list[dict[str, float]]) -> None:
    """``validate``/``test``'s results, one column per loader, as Lightning's ``verbose`` table."""
    from rich.console import Console
    from rich.table import Table

    if len(results) > 1:  # one row per metric, a column per loader, as in Lightning
        results = [{k.rpartition("/dataloader_idx_")[0] or k: v for k, v in r.items()} for r in results]
    names = sorted({name for per_loader in results for name in per_loader})
    if not names:
        return
    table = Table(title=f"{fn} results", title_justify="left")
    table.add_column("Metric")
    for i in range(len(results)):
        table.add_column("value" if len(results) == 1 else f"dataloader {i}", justify="right")
    for name in names:
        table.add_row(name, *(f"{r[name]:.6g}" if name in r else "" for r in results))
    Console(stderr=True).print(table)


def parameter_bytes(module: nn.Module) -> str:
    """The bytes of parameters this rank holds, and of the whole model where it holds a shard
    (FSDP: a parameter is a DTensor whose ``numel`` is the whole tensor's)."""
    local = whole = 0
    for p in module.parameters():
        mine = p.to_local() if hasattr(p, "to_local") else p
        local += mine.numel() * mine.element_size()
        whole += p.numel() * p.element_size()
    share = f" of {_bytes(whole)}" if local != whole else ""
    return f"parameters {_bytes(local)} per rank{share}"


def _bytes(n: int) -> str:
    return _count(n, ("GB", "MB", "kB"), ones="B")
