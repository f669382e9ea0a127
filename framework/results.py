"""What ``self.log`` records, and how it becomes step values and epoch aggregates.

Step values are kept as tensors (no ``.item()``, no host sync per step); they are turned into
floats only when a logger or the progress bar asks. Epoch values are the mean weighted by batch
size (or sum/max/min), reduced across ranks when ``sync_dist=True``; a torchmetrics ``Metric``
is computed (torchmetrics syncs its own state across ranks) and reset at the end of each epoch.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch

from framework.errors import ConfigError

_REDUCE_FX = ("mean", "sum", "max", "min")


@dataclasses.dataclass
class _Entry:
    name: str
    on_step: bool
    on_epoch: bool
    prog_bar: bool
    logger: bool
    sync_dist: bool
    reduce_fx: str
    metric: Any = None  # torchmetrics.Metric
    total: torch.Tensor | None = None  # weighted sum (mean/sum) or running max/min
    weight: float = 0.0
    last: torch.Tensor | None = None

    @property
    def step_key(self) -> str:
        return f"{self.name}_step" if self.on_epoch else self.name

    @property
    def epoch_key(self) -> str:
        return f"{self.name}_epoch" if self.on_step else self.name


class MetricCollector:
    """The metrics of one stage (train, validate, test, predict) for the current epoch."""

    def __init__(self, stage: str, batch_size_fn: Callable[[], int]) -> None:
        self.stage = stage
        self._batch_size_fn = batch_size_fn
        self.entries: dict[str, _Entry] = {}
        self.epoch_values: dict[str, torch.Tensor] = {}
        self.epoch_flags: dict[str, tuple[bool, bool]] = {}  # key -> (prog_bar, logger)
        self.step_dirty = False

    def log(self, name: str, value: Any, *, prog_bar: bool, logger: bool, on_step: bool | None,
            on_epoch: bool | None, reduce_fx: str, sync_dist: bool, batch_size: int | None) -> None:
        entry = self.entries.get(name)
        if entry is None:
            entry = self._new_entry(name, value, prog_bar, logger, on_step, on_epoch, reduce_fx, sync_dist)
        if entry.metric is not None:
            if entry.on_step:
                cached = getattr(entry.metric, "_forward_cache", None)
                if cached is not None:
                    entry.last = cached.detach()
                    self.step_dirty = True
            return
        if isinstance(value, torch.Tensor):
            value = value.detach()
            if value.numel() != 1:
                raise ValueError(f"self.log('{name}'): expected a scalar, got a tensor of shape {tuple(value.shape)}")
            value = value.reshape(())
        else:
            value = torch.tensor(float(value))
        if value.dtype != torch.float32:
            value = value.float()
        if entry.on_step:
            entry.last = value
            self.step_dirty = True
        if entry.on_epoch:
            self._accumulate(entry, value, batch_size)

    def _new_entry(self, name, value, prog_bar, logger, on_step, on_epoch, reduce_fx, sync_dist) -> _Entry:
        if reduce_fx not in _REDUCE_FX:
            raise ConfigError(f"self.log('{name}', reduce_fx='{reduce_fx}'): use one of {', '.join(_REDUCE_FX)}")
        training = self.stage == "train"
        on_step = training if on_step is None else on_step
        on_epoch = (not training) if on_epoch is None else on_epoch
        metric = value if _is_metric(value) else None
        if metric is not None and self.stage != "train" and on_step is None:
            on_step = False
        entry = _Entry(name, bool(on_step), bool(on_epoch), prog_bar, logger, sync_dist, reduce_fx, metric)
        self.entries[name] = entry
        return entry

    def _accumulate(self, entry: _Entry, value: torch.Tensor, batch_size: int | None) -> None:
        if entry.reduce_fx == "mean":
            size = batch_size if batch_size is not None else self._batch_size_fn()
            entry.total = value * size if entry.total is None else entry.total + value * size
            entry.weight += size
        elif entry.reduce_fx == "sum":
            entry.total = value if entry.total is None else entry.total + value
            entry.weight = 1.0
        else:
            fn = torch.maximum if entry.reduce_fx == "max" else torch.minimum
            entry.total = value if entry.total is None else fn(entry.total, value)
            entry.weight = 1.0

    # -- reading --------------------------------------------------------------------------------
    def step_values(self) -> dict[str, torch.Tensor]:
        return {e.step_key: e.last for e in self.entries.values() if e.on_step and e.last is not None}

    def step_values_for(self, flag: str) -> dict[str, torch.Tensor]:
        return {e.step_key: e.last for e in self.entries.values()
                if e.on_step and e.last is not None and getattr(e, flag)}

    def compute_epoch(self, strategy) -> dict[str, torch.Tensor]:
        """Aggregate this epoch's values (collective when distributed: call on every rank)."""
        values: dict[str, torch.Tensor] = {}
        for name in sorted(self.entries):
            entry = self.entries[name]
            if not entry.on_epoch:
                continue
            if entry.metric is not None:
                value = entry.metric.compute().detach()
                entry.metric.reset()
            elif entry.total is None:
                continue
            else:
                value = self._reduce(entry, strategy)
            value = value.float().reshape(()) if value.numel() == 1 else value.float()
            values[entry.epoch_key] = value
            self.epoch_flags[entry.epoch_key] = (entry.prog_bar, entry.logger)
            if entry.on_step:  # the plain name also carries the epoch value, as in Lightning
                values[entry.name] = value
        self.epoch_values = values
        return values

    def _reduce(self, entry: _Entry, strategy) -> torch.Tensor:
        total = entry.total
        if entry.reduce_fx == "mean":
            if entry.sync_dist and strategy.is_distributed:
                pair = torch.stack([total.float().cpu(), torch.tensor(entry.weight)])
                pair = strategy.all_reduce(pair.to(strategy._collective_device()), "sum").cpu()
                return pair[0] / pair[1]
            return total / entry.weight
        if entry.sync_dist and strategy.is_distributed:
            op = {"sum": "sum", "max": "max", "min": "min"}[entry.reduce_fx]
            return strategy.all_reduce(total.float().to(strategy._collective_device()), op).cpu()
        return total

    def reset(self) -> None:
        """Start a new epoch: forget values, reset metric objects."""
        for entry in self.entries.values():
            if entry.metric is not None:
                entry.metric.reset()
        self.entries.clear()
        self.step_dirty = False


def _is_metric(value: Any) -> bool:
    module = type(value).__module__
    if not module.startswith("torchmetrics"):
        return any(c.__module__.startswith("torchmetrics") for c in type(value).__mro__[1:])
    return hasattr(value, "compute") and hasattr(value, "reset")
