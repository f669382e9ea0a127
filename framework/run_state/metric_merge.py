"""Several ranks' running metric aggregates as one rank's (a mid-epoch checkpoint resumed on
fewer ranks: each rank takes over the aggregates of the ranks it replaces).

A logged tensor's aggregate is a weighted sum and its weight (``mean``, ``sum``), or a running
``max``/``min``: the merged one is their sum (or max, min), which is what reducing over the ranks
(``sync_dist=True``) gives at the epoch's end anyway. A torchmetrics ``Metric``'s states merge
as torchmetrics merges them when it syncs: tensors stacked and reduced with the state's
``dist_reduce_fx``, lists joined.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from framework.errors import CheckpointError


def merge_aggregates(states: list[dict], module: nn.Module) -> dict:
    """One aggregate per name from several ranks' ``MetricCollector.state_dict()``s."""
    if len(states) == 1:
        return states[0]
    by_name: dict[str, list[dict]] = {}
    for state in states:
        for name, item in state.items():
            by_name.setdefault(name, []).append(item)
    return {name: _merge(name, items, module) for name, items in by_name.items()}


def _merge(name: str, items: list[dict], module: nn.Module) -> dict:
    first = items[0]
    if len(items) == 1:
        return first
    if "metric_path" in first:
        metric = module.get_submodule(first["metric_path"])
        return {**first, "metric_state": {key: _merge_state(name, key, [item["metric_state"][key] for item in items], metric)
                                          for key in first["metric_state"]}}
    totals, weight = torch.stack([item["total"] for item in items]), sum(item["weight"] for item in items)
    reduce_fx = first["flags"][5]
    total = totals.amax(0) if reduce_fx == "max" else totals.amin(0) if reduce_fx == "min" else totals.sum(0)
    return {**first, "total": total, "weight": weight}


def _merge_state(name: str, key: str, values: list, metric: Any) -> Any:
    """As torchmetrics' own sync: lists joined, tensors stacked and reduced."""
    if isinstance(values[0], list):
        return [t for value in values for t in value]
    reduce = metric._reductions.get(key)
    if reduce is None:
        raise CheckpointError(f"self.log('{name}', metric): its state '{key}' has no dist_reduce_fx, so the aggregates "
                              "of several ranks cannot be merged; resume on the number of ranks the checkpoint was "
                              "written with, or from a checkpoint written at an epoch end")
    return reduce(torch.stack(values))
