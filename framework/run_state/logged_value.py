"""What ``self.log`` may log, as the metric collector keeps it: a number or a one-element tensor
(detached, at least float32, as Lightning keeps it), or a torchmetrics ``Metric``; and how a
value logged with ``sync_dist=True`` is reduced over the ranks."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from framework.run_state.metric_collector import _Entry as Entry
    from framework.strategies import Strategy


def is_metric(value: Any) -> bool:
    """Is ``value`` a torchmetrics ``Metric``? (If torchmetrics was never imported, it is not.)"""
    torchmetrics = sys.modules.get("torchmetrics")
    return torchmetrics is not None and isinstance(value, torchmetrics.Metric)


def as_scalar(name: str, value: Any) -> torch.Tensor:
    """A logged number or one-element tensor as a float32 (or float64) scalar tensor (detached)."""
    if isinstance(value, torch.Tensor):
        value = value.detach()
        if type(value) is not torch.Tensor and hasattr(value, "full_tensor"):  # a DTensor: a loss parallel loss
            value = value.full_tensor()
        if value.numel() != 1:
            raise ValueError(f"self.log('{name}'): expected a scalar, got a tensor of shape {tuple(value.shape)}")
        value = value.reshape(())
    elif hasattr(value, "__float__") and not isinstance(value, (str, bytes)):  # int, float, bool, a numpy number
        value = torch.tensor(float(value))
    else:
        raise ValueError(f"self.log('{name}', {value!r}): the value must be a number, a one-element tensor or a "
                         f"torchmetrics Metric, not {type(value).__name__}")
    return at_least_float32(value)


def at_least_float32(value: torch.Tensor) -> torch.Tensor:
    """float32, or float64 where it is that: Lightning keeps a logged value "in float32 or
    higher to maintain accuracy" (a float64 loss is logged and averaged in float64)."""
    return value if value.dtype in (torch.float32, torch.float64) else value.float()


def reduce_across_ranks(entry: Entry, strategy: Strategy) -> torch.Tensor:
    """An entry's epoch value logged with ``sync_dist=True``: the sum (a weighted mean), sum, max or
    min over the ranks; a rank with no value adds nothing."""
    device = strategy.collective_device
    if entry.reduce_fx == "mean":
        total = entry.total.float().cpu() if entry.total is not None else torch.tensor(0.0)
        pair = strategy.all_reduce_over_data(torch.stack([total, torch.tensor(float(entry.weight))]).to(device), "sum").cpu()
        return pair[0] / pair[1]
    neutral = {"sum": 0.0, "max": float("-inf"), "min": float("inf")}[entry.reduce_fx]
    total = entry.total.float().cpu() if entry.total is not None else torch.tensor(neutral)
    return strategy.all_reduce_over_data(total.to(device), entry.reduce_fx).cpu()
