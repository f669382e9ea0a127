"""Logged metrics: what ``self.log`` records, and how it becomes step values and epoch aggregates.

``LoggedMetrics`` (``trainer.metrics``) is what the run has logged: the collector of the stage
that runs now, the epoch aggregates so far, and the dictionaries Lightning users read
(``callback_metrics``, ``progress_bar_metrics``). A ``MetricCollector`` holds one stage's epoch.

Step values are kept as tensors (no ``.item()``, no host sync per step); they are turned into
floats only when a logger or the progress bar asks. Epoch values are the mean weighted by batch
size (or sum/max/min), reduced across ranks when ``sync_dist=True``; a torchmetrics ``Metric``
is computed (torchmetrics syncs its own state across ranks) and reset at the end of each epoch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch

from framework.data import batch_size_of
from framework.errors import ConfigError
from framework.rank_zero import rank_zero_warn

_REDUCE_FX = ("mean", "sum", "max", "min")


class LoggedMetrics:
    """Everything the run has logged, and the batch whose size weights epoch means."""

    def __init__(self) -> None:
        self.current_batch: Any = None
        #: the strategy of a distributed run (set by set-up): ``sync_dist`` step values are
        #: reduced over its ranks when logged, as Lightning does
        self.strategy: Any = None
        self.collector = MetricCollector("train", self.current_batch_size)
        self.training = self.collector  # this training epoch's, also while an evaluation runs
        self.epoch_values: dict[str, torch.Tensor] = {}
        self.prog_bar_keys: dict[str, bool] = {}  # epoch metric -> shown in the progress bar
        self._callback_metrics: dict[str, torch.Tensor] = {}

    def current_batch_size(self) -> int:
        return batch_size_of(self.current_batch)

    def log(self, name: str, value: Any, **options: Any) -> None:
        """``self.log`` of the module: record in the collector of the stage that runs."""
        self.collector.log(name, value, **options)
        entry = self.collector.entries[name]
        if entry.on_step and entry.sync_dist and entry.metric is None and self.strategy is not None:
            entry.last = self._synced_step_value(entry)

    def _synced_step_value(self, entry: _Entry) -> torch.Tensor:
        """A ``sync_dist=True`` step value reduced over the ranks now (a collective: every rank
        logs it at the same batch). Training shards are equal; evaluation shards are exact, so
        ranks may run different numbers of batches there, and a per-step collective would hang."""
        if self.collector.stage != "train":
            raise ConfigError(
                f"self.log('{entry.name}', on_step=True, sync_dist=True) in {self.collector.stage}: fw's exact "
                "distributed evaluation gives ranks unequal numbers of batches, so a per-step reduction over "
                "ranks cannot be done; log it with on_step=False (the epoch value is reduced exactly)"
            )
        strategy = self.strategy
        value = strategy.all_reduce(entry.last.to(strategy.collective_device), entry.reduce_fx)
        return value.to(entry.last.device)

    def new_epoch(self, stage: str) -> MetricCollector:
        """A fresh collector for a training epoch (its step values replace the last epoch's)."""
        self.collector = self.training = MetricCollector(stage, self.current_batch_size)
        return self.collector

    @contextlib.contextmanager
    def evaluating(self, stage: str) -> Iterator[MetricCollector]:
        """A collector for one evaluation pass; the training collector comes back after it.
        The training steps' latest values stay in ``callback_metrics`` meanwhile, as in Lightning
        (a ModelCheckpoint that saves after validation may monitor them)."""
        self._callback_metrics.update(self.collector.step_values())
        training, self.collector = self.collector, MetricCollector(stage, self.current_batch_size)
        try:
            yield self.collector
        finally:
            self.collector = training

    @contextlib.contextmanager
    def kept(self, keep: bool) -> Iterator[None]:
        """With ``keep``, what is recorded inside is forgotten after it (the sanity check)."""
        if not keep:
            yield
            return
        saved = dict(self.epoch_values), dict(self.prog_bar_keys), dict(self._callback_metrics)
        try:
            yield
        finally:
            self.epoch_values, self.prog_bar_keys = saved[0], saved[1]
            self._callback_metrics.clear()
            self._callback_metrics.update(saved[2])

    def record_epoch(self, collector: MetricCollector) -> None:
        """Keep ``collector``'s epoch aggregates as the run's latest values."""
        self.epoch_values.update(collector.epoch_values)
        self.prog_bar_keys.update({k: flags[0] for k, flags in collector.epoch_flags.items()})

    def take_values(self, values: dict[str, torch.Tensor], prog_bar: set[str]) -> None:
        """Hold ``values`` as the latest metrics (the results of a run made in other
        processes: ``ddp_spawn``), ``prog_bar`` of them shown in the progress bar."""
        self.collector = self.training = MetricCollector("train", self.current_batch_size)
        self.epoch_values = dict(values)
        self.prog_bar_keys = {k: k in prog_bar for k in values}
        self._callback_metrics.clear()

    @property
    def callback_metrics(self) -> dict[str, torch.Tensor]:
        """One dict, kept for the run: the latest step values and every epoch aggregate.

        It is the same dict on every read, so what a callback writes into it stays (until a
        newer logged value of the same name replaces it), as in Lightning.
        """
        self._callback_metrics.update(self.collector.step_values())
        self._callback_metrics.update(self.epoch_values)
        return self._callback_metrics

    @property
    def progress_bar_metrics(self) -> dict[str, float]:
        values = self.collector.step_values_for("prog_bar")
        values.update({k: v for k, v in self.epoch_values.items() if self.prog_bar_keys.get(k)})
        return {k: float(v) for k, v in values.items() if v.numel() == 1}


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
    version: int = 0  # values logged so far this epoch
    computed: int = -1  # the version the epoch value was last computed at

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
        self._first_pass_done = False  # compute_epoch(final=False) ran: the epoch-end hooks run now

    def log(self, name: str, value: Any, *, prog_bar: bool, logger: bool, on_step: bool | None,
            on_epoch: bool | None, reduce_fx: str, sync_dist: bool, batch_size: int | None) -> None:
        entry = self.entries.get(name)
        if entry is None:
            entry = self._new_entry(name, value, prog_bar, logger, on_step, on_epoch, reduce_fx, sync_dist)
        entry.version += 1
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

    # -- checkpoints (a mid-epoch resume continues the epoch's aggregates) ----------------------
    def state_dict(self, module) -> dict:
        """The running epoch aggregates: sums and weights, and torchmetrics states."""
        saved: dict[str, dict] = {}
        for name, entry in self.entries.items():
            if not entry.on_epoch:
                continue
            flags, path = _spec(entry, module)
            if entry.metric is None:
                saved[name] = {"flags": flags, "total": entry.total, "weight": entry.weight}
            elif path is not None:
                states = {k: v.clone() if isinstance(v, torch.Tensor) else [t.clone() for t in v]
                          for k, v in entry.metric.metric_state.items()}
                saved[name] = {"flags": flags, "metric_path": path, "metric_state": states}
            else:
                rank_zero_warn(f"self.log('{name}', metric): the metric is not an attribute of the module, so a "
                               "checkpoint cannot keep its state; after a mid-epoch resume its epoch value "
                               "covers only the batches after the resume. Make it an attribute of the module")
        return saved

    def load_state_dict(self, saved: dict, module) -> None:
        for name, item in saved.items():
            entry = _Entry(name, *item["flags"][:6])
            if "metric_path" in item:
                entry.metric = module.get_submodule(item["metric_path"])
                for key, value in item["metric_state"].items():
                    setattr(entry.metric, key, value)
                entry.metric._update_count = max(1, getattr(entry.metric, "_update_count", 0))
            else:
                entry.total, entry.weight = item["total"], item["weight"]
            self.entries[name] = entry

    # -- reading --------------------------------------------------------------------------------
    def step_values(self) -> dict[str, torch.Tensor]:
        return {e.step_key: e.last for e in self.entries.values() if e.on_step and e.last is not None}

    def step_values_for(self, flag: str) -> dict[str, torch.Tensor]:
        return {e.step_key: e.last for e in self.entries.values()
                if e.on_step and e.last is not None and getattr(e, flag)}

    def compute_epoch(self, strategy, module=None, final: bool = True) -> dict[str, torch.Tensor]:
        """Aggregate this epoch's values; with ``final``, reset every metric object after.

        The epoch end computes twice, as Lightning's lazily computed results amount to: once
        (``final=False``) before the epoch-end hooks, so that they see this epoch's values, and
        once after (``final=True``), for what they logged themselves; the second pass computes
        only entries logged since the first. Collective when distributed (call on every rank):
        a rank that logged nothing (no batch in its shard) still takes part in each reduction.
        """
        changed = self._changed_entries(strategy, module)
        values = dict(self.epoch_values) if self._first_pass_done else {}
        for name in sorted(changed):
            entry = self.entries[name]
            value = self._epoch_value(entry, strategy)
            entry.computed = entry.version
            if value is None:
                continue
            value = value.float().reshape(()) if value.numel() == 1 else value.float()
            values[entry.epoch_key] = value
            self.epoch_flags[entry.epoch_key] = (entry.prog_bar, entry.logger)
            if entry.on_step:  # the plain name also carries the epoch value, as in Lightning
                values[entry.name] = value
        self._first_pass_done = not final
        if final:
            for entry in self.entries.values():  # every metric object starts the next epoch empty
                if entry.metric is not None:
                    entry.metric.reset()
        self.epoch_values = values
        return values

    def _changed_entries(self, strategy, module) -> set[str]:
        """Epoch entries to compute now: all of them in a first pass, else those logged since
        (on any rank: every rank must join the same reductions)."""
        if strategy.is_distributed:
            self._adopt_entries_of_other_ranks(strategy, module)
        epoch_entries = {name for name, entry in self.entries.items() if entry.on_epoch}
        if not self._first_pass_done:
            return epoch_entries
        changed = {name for name in epoch_entries if self.entries[name].version != self.entries[name].computed}
        if strategy.is_distributed:
            changed = set().union(*strategy.all_gather_object(sorted(changed))) & epoch_entries
        return changed

    def _epoch_value(self, entry: _Entry, strategy) -> torch.Tensor | None:
        if entry.metric is not None:
            return entry.metric.compute().detach()  # torchmetrics syncs its state across ranks
        if entry.sync_dist and strategy.is_distributed:
            return _reduce_across_ranks(entry, strategy)
        if entry.total is None:
            return None
        return entry.total / entry.weight if entry.reduce_fx == "mean" else entry.total

    def _adopt_entries_of_other_ranks(self, strategy, module) -> None:
        """Make every rank hold the same synced entries, in the same order, before reducing."""
        specs = {name: _spec(entry, module) for name, entry in self.entries.items()
                 if entry.on_epoch and (entry.sync_dist or entry.metric is not None)}
        for other in strategy.all_gather_object(specs):
            for name, (flags, metric_path) in other.items():
                if name in self.entries:
                    continue
                metric = None
                if metric_path is not None:
                    metric = module.get_submodule(metric_path)
                elif flags[-1] == "metric":
                    raise RuntimeError(
                        f"self.log('{name}', metric) ran on some ranks only, and the metric is not an "
                        "attribute of the module, so the other ranks cannot join its sync; make it one"
                    )
                self.entries[name] = _Entry(name, *flags[:6], metric=metric)


def _spec(entry: _Entry, module) -> tuple:
    flags = (entry.on_step, entry.on_epoch, entry.prog_bar, entry.logger, entry.sync_dist, entry.reduce_fx,
             "metric" if entry.metric is not None else "tensor")
    path = None
    if entry.metric is not None and module is not None:
        path = next((n for n, m in module.named_modules() if m is entry.metric), None)
    return flags, path


def _reduce_across_ranks(entry: _Entry, strategy) -> torch.Tensor:
    """Sum (weighted mean), sum, max or min over ranks; a rank with no value adds nothing."""
    device = strategy.collective_device
    if entry.reduce_fx == "mean":
        total = entry.total.float().cpu() if entry.total is not None else torch.tensor(0.0)
        pair = strategy.all_reduce(torch.stack([total, torch.tensor(float(entry.weight))]).to(device), "sum").cpu()
        return pair[0] / pair[1]
    neutral = {"sum": 0.0, "max": float("-inf"), "min": float("inf")}[entry.reduce_fx]
    total = entry.total.float().cpu() if entry.total is not None else torch.tensor(neutral)
    return strategy.all_reduce(total.to(device), entry.reduce_fx).cpu()


def _is_metric(value: Any) -> bool:
    """Is ``value`` a torchmetrics ``Metric``? (If torchmetrics was never imported, it is not.)"""
    torchmetrics = sys.modules.get("torchmetrics")
    return torchmetrics is not None and isinstance(value, torchmetrics.Metric)
