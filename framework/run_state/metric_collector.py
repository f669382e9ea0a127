"""``MetricCollector``: the metrics one stage (train, validate, test, predict) logged in the
current epoch, and how they become epoch values: the mean weighted by batch size (or sum, max,
min), reduced across ranks when ``sync_dist=True``; a torchmetrics ``Metric`` is computed (it
syncs its own state) and reset at the epoch's end. A mid-epoch checkpoint keeps the running
aggregates (``state_dict``)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from framework.errors import ConfigError
from framework.rank_zero import rank_zero_warn
from framework.run_state.log_options import useful
from framework.run_state.logged_value import as_scalar, at_least_float32, is_metric, reduce_across_ranks
from framework.waiting import waiting_in

if TYPE_CHECKING:
    from framework.strategies import Strategy

_REDUCE_FX = ("mean", "sum", "max", "min")
#: an entry's flags, as ranks exchange them and checkpoints keep them: on_step, on_epoch,
#: prog_bar, logger, sync_dist, reduce_fx, and "metric" or "tensor"
_Flags = tuple[bool, bool, bool, bool, bool, str, str]
#: an entry as ranks exchange it: its flags, and its metric's path in the module (None: a tensor,
#: or a metric that is not part of the module)
_Spec = tuple[_Flags, str | None]


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
    #: with several evaluation loaders: the loader that logged it, and ``/dataloader_idx_N``
    #: after its name (unless logged with ``add_dataloader_idx=False``), as in Lightning
    dataloader_idx: int | None = None
    suffix: str = ""

    @property
    def key(self) -> str:
        return self.name + self.suffix

    @property
    def step_key(self) -> str:  # the suffix after the fork, as Lightning names it: x_step/dataloader_idx_0
        return f"{self.name}_step{self.suffix}" if self.on_epoch else self.key

    @property
    def epoch_key(self) -> str:
        return f"{self.name}_epoch{self.suffix}" if self.on_step else self.key


class MetricCollector:
    """The metrics of one stage (train, validate, test, predict) for the current epoch."""

    def __init__(self, stage: str, batch_size_fn: Callable[[], int]) -> None:
        self.stage = stage
        self._batch_size_fn = batch_size_fn
        self.entries: dict[str, _Entry] = {}
        self.epoch_values: dict[str, torch.Tensor] = {}
        self.epoch_flags: dict[str, tuple[bool, bool]] = {}  # key -> (prog_bar, logger)
        self.epoch_loaders: dict[str, int | None] = {}  # key -> the evaluation loader that logged it (of several)
        self.step_dirty = False
        self._first_pass_done = False  # compute_epoch(final=False) ran: the epoch-end hooks run now
        self._second_pass_due = True  # some rank's epoch-end hooks may log (decided in the first pass)

    def log(self, name: str, value: Any, *, prog_bar: bool, logger: bool, on_step: bool | None,
            on_epoch: bool | None, reduce_fx: str, sync_dist: bool, batch_size: int | None,
            dataloader_idx: int | None = None, suffix: str = "") -> _Entry:
        """Record one logged value; the entry it went into (``dataloader_idx``: the evaluation
        loader it came from, when there are several; ``suffix``: what its name gets for it). Flags
        not given are the stage's (training: per step; evaluation: per epoch), at every call."""
        training = self.stage == "train"
        on_step, on_epoch = useful(name, training if on_step is None else on_step, not training if on_epoch is None else on_epoch)
        scalar = None if is_metric(value) else as_scalar(name, value)
        entry = self.entries.get(name + suffix)
        if entry is None:
            entry = self._new_entry(name, value, prog_bar, logger, on_step, on_epoch, reduce_fx, sync_dist)
            entry.dataloader_idx, entry.suffix = dataloader_idx, suffix
            self.entries[entry.key] = entry
        elif dataloader_idx is not None and entry.dataloader_idx not in (None, dataloader_idx):
            raise ConfigError(
                f"self.log('{name}', add_dataloader_idx=False) in loader {dataloader_idx} after loader "
                f"{entry.dataloader_idx} logged '{name}': their values would mix (Lightning refuses it too); give each "
                f"loader a name of its own, or leave add_dataloader_idx=True ('{name}/dataloader_idx_N')")
        entry.version += 1
        if entry.metric is not None:
            if entry.on_step:
                cached = getattr(entry.metric, "_forward_cache", None)
                if cached is not None:
                    entry.last = cached.detach()
                    self.step_dirty = True
            return entry
        if scalar is None:
            raise ValueError(f"self.log('{name}'): a torchmetrics Metric, where a plain value was logged under this "
                             "name before; log one kind of value under one name")
        value = scalar
        if entry.on_step:
            entry.last = value
            self.step_dirty = True
        if entry.on_epoch:
            self._accumulate(entry, value, batch_size)
        return entry

    def _new_entry(self, name: str, value: Any, prog_bar: bool, logger: bool, on_step: bool,
                   on_epoch: bool, reduce_fx: str, sync_dist: bool) -> _Entry:
        if reduce_fx not in _REDUCE_FX:
            raise ConfigError(f"self.log('{name}', reduce_fx='{reduce_fx}'): use one of {', '.join(_REDUCE_FX)}")
        metric = value if is_metric(value) else None
        return _Entry(name, bool(on_step), bool(on_epoch), prog_bar, logger, sync_dist, reduce_fx, metric)

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
    def state_dict(self, module: nn.Module | None) -> dict:
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

    def load_state_dict(self, saved: dict, module: nn.Module) -> None:
        for name, item in saved.items():
            entry = _entry_named(name, item["flags"])
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

    def newer_step_values(self) -> dict[str, torch.Tensor]:
        """``x`` of each ``on_step`` and ``on_epoch`` value logged since its epoch value: its latest
        step's, as Lightning's ``callback_metrics`` holds it during the epoch."""
        return {e.key: e.last for e in self.entries.values()
                if e.on_step and e.on_epoch and e.last is not None and e.version != e.computed}

    def step_values_for(self, flag: str, loader: int | None = None) -> dict[str, torch.Tensor]:
        """The step values logged with ``flag`` (``logger``, ``prog_bar``); given a ``loader``
        (of several), only its own (Lightning's evaluation rows hold the loader's alone)."""
        return {e.step_key: e.last for e in self.entries.values()
                if e.on_step and e.last is not None and getattr(e, flag) and (loader is None or e.dataloader_idx == loader)}

    def compute_epoch(self, strategy: Strategy, module: nn.Module | None = None, final: bool = True,
                      hooks_may_log: bool = True) -> dict[str, torch.Tensor]:
        """Aggregate this epoch's values; with ``final``, reset every metric object after.

        The epoch end computes twice, as Lightning's lazily computed results amount to: once
        (``final=False``) before the epoch-end hooks, so that they see this epoch's values, and
        once after (``final=True``), for what they logged themselves; the second pass computes
        only entries logged since the first. Collective when distributed (call on every rank):
        a rank that logged nothing (no batch in its shard) still takes part in each reduction.
        ``hooks_may_log`` (first pass): this rank runs epoch-end hooks that could log; where no
        rank does (its check settles that for all), the second pass computes and asks nothing.
        """
        if final and self._first_pass_done and not self._second_pass_due:
            changed: set[str] = set()  # nothing ran that could log, on any rank
        else:
            changed = self._changed_entries(strategy, module, hooks_may_log)
        values = dict(self.epoch_values) if self._first_pass_done else {}
        for name in sorted(changed):
            entry = self.entries[name]
            value = self._epoch_value(entry, strategy)
            entry.computed = entry.version
            if value is None:
                continue
            value = at_least_float32(value.reshape(()) if value.numel() == 1 else value)
            values[entry.epoch_key] = value
            self.epoch_flags[entry.epoch_key] = (entry.prog_bar, entry.logger)
            self.epoch_loaders[entry.epoch_key] = entry.dataloader_idx
            if entry.on_step:  # the plain name also carries the epoch value, as in Lightning
                values[entry.key] = value
        self._first_pass_done = not final
        if final:
            self._second_pass_due = True
            for entry in self.entries.values():  # every metric object starts the next epoch empty
                if entry.metric is not None:
                    entry.metric.reset()
        self.epoch_values = values
        return values

    def _changed_entries(self, strategy: Strategy, module: nn.Module | None, hooks_may_log: bool) -> set[str]:
        """Epoch entries to compute now: all of them in a first pass, else those logged since (on
        any rank: all must join the same reductions); a first pass settles if a second is due."""
        changed = {name for name, entry in self.entries.items()
                   if entry.on_epoch and (not self._first_pass_done or entry.version != entry.computed)}
        due = hooks_may_log
        if strategy.is_distributed:  # one gather: the other ranks' entries and what changed there
            with waiting_in(f"the {self.stage} epoch's metric sync"):
                adopted, due = self._adopt_entries_of_other_ranks(strategy, module, changed, hooks_may_log)
                changed |= adopted
        if not self._first_pass_done:
            self._second_pass_due = due
        return changed

    def _epoch_value(self, entry: _Entry, strategy: Strategy) -> torch.Tensor | None:
        if entry.metric is not None:
            return entry.metric.compute().detach()  # torchmetrics syncs its state across ranks
        if entry.sync_dist and strategy.is_distributed:
            return reduce_across_ranks(entry, strategy)
        if entry.total is None:
            return None
        return entry.total / entry.weight if entry.reduce_fx == "mean" else entry.total

    def _adopt_entries_of_other_ranks(self, strategy: Strategy, module: nn.Module | None, changed: set[str],
                                      hooks_may_log: bool) -> tuple[set[str], bool]:
        """Make every rank hold the same synced entries, in the same order, before reducing;
        returns the entries any rank has in ``changed`` (each rank passes its own), and those
        adopted here; and whether any rank's ``hooks_may_log``."""
        specs = {name: _spec(entry, module) for name, entry in self.entries.items()
                 if entry.on_epoch and (entry.sync_dist or entry.metric is not None)}
        if strategy.the_same_on_every_rank(repr((sorted(specs.items()), sorted(changed), hooks_may_log))):
            return set(changed), hooks_may_log  # nothing to adopt (the usual case): one small all-reduce
        changed_anywhere: set[str] = set()
        gathered: list[tuple[dict[str, _Spec], list[str], bool]] = strategy.all_gather_object(
            (specs, sorted(changed), hooks_may_log))
        for other, their_changed, _ in gathered:
            changed_anywhere.update(their_changed)
            for name, (flags, metric_path) in other.items():
                if name in self.entries:
                    continue
                metric = None
                if metric_path is not None and module is not None:
                    metric = module.get_submodule(metric_path)
                elif flags[-1] == "metric":
                    raise RuntimeError(
                        f"self.log('{name}', metric) ran on some ranks only, and the metric is not an "
                        "attribute of the module, so the other ranks cannot join its sync; make it one"
                    )
                self.entries[name] = _entry_named(name, flags, metric)
                changed_anywhere.add(name)
        may_log = any(theirs for _, _, theirs in gathered)
        return changed_anywhere & {name for name, entry in self.entries.items() if entry.on_epoch}, may_log


def _entry_named(key: str, flags: _Flags, metric: Any = None) -> _Entry:
    """The entry of ``key`` with ``flags`` (another rank's, or a checkpoint's): a key that ends
    in ``/dataloader_idx_N`` is loader N's."""
    found = re.fullmatch(r"(.*)(/dataloader_idx_(\d+))", key)
    if found is None:
        return _Entry(key, *flags[:6], metric=metric)
    return _Entry(found[1], *flags[:6], metric=metric, dataloader_idx=int(found[3]), suffix=found[2])


def _spec(entry: _Entry, module: nn.Module | None) -> _Spec:
    flags: _Flags = (entry.on_step, entry.on_epoch, entry.prog_bar, entry.logger, entry.sync_dist, entry.reduce_fx,
             "metric" if entry.metric is not None else "tensor")
    path = None
    if entry.metric is not None and module is not None:
        path = next((n for n, m in module.named_modules() if m is entry.metric), None)
    return flags, path
