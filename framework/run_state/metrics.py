"""Logged metrics: what ``self.log`` records, and how it becomes step values and epoch aggregates.

``LoggedMetrics`` (``trainer.metrics``) is what the run has logged: the collector of the stage
that runs now, the epoch aggregates so far, and the dictionaries Lightning users read
(``callback_metrics``, ``progress_bar_metrics``). A ``MetricCollector`` holds one stage's epoch
(``metric_collector.py``).

Step values are kept as tensors (no ``.item()``, no host sync per step); they are turned into
floats only when a logger or the progress bar asks. Epoch values are the mean weighted by batch
size (or sum/max/min), reduced across ranks when ``sync_dist=True``; a torchmetrics ``Metric``
is computed (torchmetrics syncs its own state across ranks) and reset at the end of each epoch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from framework.data import batch_size_of
from framework.errors import ConfigError
from framework.run_state import log_options
from framework.run_state.metric_collector import MetricCollector, _Entry

if TYPE_CHECKING:
    from framework.strategies import Strategy


class LoggedMetrics:
    """Everything the run has logged, and the batch whose size weights epoch means."""

    def __init__(self) -> None:
        self.current_batch: Any = None
        #: the strategy of a distributed run (set by set-up): ``sync_dist`` step values are
        #: reduced over its ranks when logged, as Lightning does
        self.strategy: Strategy | None = None
        self.collector = MetricCollector("train", self.current_batch_size)
        self.training = self.collector  # this training epoch's, also while an evaluation runs
        self._first_epoch_pending = True  # the first training epoch takes over what on_train_start logged
        #: the hook that runs (set by ``HookDispatcher``; None in the steps and per-batch hooks):
        #: where ``self.log`` may log and its defaults there (``log_options.py``)
        self.fx: str | None = None
        #: the evaluation loader whose batch runs, where there are several (else None): what
        #: its step and batch hooks log is that loader's own (``x/dataloader_idx_N``)
        self.dataloader_idx: int | None = None
        self.epoch_loaders: dict[str, int | None] = {}  # epoch metric -> the loader that logged it (of several)
        self.epoch_values: dict[str, torch.Tensor] = {}
        self.epoch_flags: dict[str, tuple[bool, bool]] = {}  # epoch metric -> (progress bar, loggers)
        self._callback_metrics: dict[str, torch.Tensor] = {}
        #: an evaluation's step values for the loggers (``val_loss_step``) and the progress bar:
        #: kept in ``logged_metrics`` and ``progress_bar_metrics`` after it, as Lightning keeps them
        self.eval_step_logged: dict[str, torch.Tensor] = {}
        self.eval_step_bar: dict[str, torch.Tensor] = {}

    def current_batch_size(self) -> int:
        return batch_size_of(self.current_batch)

    def log(self, name: str, value: Any, **options: Any) -> None:
        """``self.log`` of the module: record in the collector of the stage that runs."""
        options = log_options.in_fw_terms(name, options)
        if self.fx is not None:
            options["on_step"], options["on_epoch"] = log_options.resolve(
                self.fx, name, options["on_step"], options["on_epoch"])
        add_idx, loader = options.pop("add_dataloader_idx"), self.dataloader_idx if self.fx is None else None
        suffix = f"/dataloader_idx_{loader}" if loader is not None and add_idx else ""  # an epoch hook's: none
        entry = self.collector.log(name, value, dataloader_idx=loader, suffix=suffix, **options)
        strategy = self.strategy
        if entry.on_step and entry.sync_dist and entry.metric is None and strategy is not None:
            entry.last = self._synced_step_value(entry, strategy)

    def _synced_step_value(self, entry: _Entry, strategy: Strategy) -> torch.Tensor:
        """A ``sync_dist=True`` step value reduced over the ranks now (a collective: every rank
        logs it at the same batch). Training shards are equal; evaluation shards are exact, so
        ranks may run different numbers of batches there, and a per-step collective would hang."""
        if self.collector.stage != "train":
            raise ConfigError(
                f"self.log('{entry.name}', on_step=True, sync_dist=True) in {self.collector.stage}: fw's exact "
                "distributed evaluation gives ranks unequal numbers of batches, so a per-step reduction over "
                "ranks cannot be done; log it with on_step=False (the epoch value is reduced exactly)"
            )
        last = entry.last
        assert last is not None, "the collector has just set this step value"
        value = strategy.all_reduce_over_data(last.to(strategy.collective_device), entry.reduce_fx)
        return value.to(last.device)

    def new_epoch(self, stage: str) -> MetricCollector:
        """A fresh collector for a training epoch (its step values replace the last epoch's); the
        run's first epoch keeps the one that on_train_start logged into, as Lightning does."""
        if not self._first_epoch_pending:
            self.collector = self.training = MetricCollector(stage, self.current_batch_size)
        self._first_epoch_pending = False
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
        saved = dict(self.epoch_values), dict(self.epoch_flags), dict(self._callback_metrics)
        try:
            yield
        finally:
            self.epoch_values, self.epoch_flags = saved[0], saved[1]
            self._callback_metrics.clear()
            self._callback_metrics.update(saved[2])

    def record_epoch(self, collector: MetricCollector) -> None:
        """Keep ``collector``'s epoch aggregates as the run's latest values."""
        self.epoch_values.update(collector.epoch_values)
        self.epoch_flags.update(collector.epoch_flags)
        self.epoch_loaders.update(collector.epoch_loaders)

    def take_values(self, values: dict[str, torch.Tensor], prog_bar: set[str], logged: set[str]) -> None:
        """Hold ``values`` as the latest metrics (the results of a run made in other
        processes: ``ddp_spawn``), ``prog_bar`` of them shown in the progress bar and
        ``logged`` of them what the loggers were sent."""
        self.collector = self.training = MetricCollector("train", self.current_batch_size)
        self.epoch_values = dict(values)
        self.epoch_flags = {k: (k in prog_bar, k in logged) for k in values}
        self._callback_metrics.clear()

    def snapshot(self) -> dict[str, Any]:
        """The values as they stand (on the CPU), for a checkpoint written at the end of an
        epoch-end validation: the resumed epoch's end reads them (``restore``) instead of
        validating again."""
        def cpu(values: dict[str, Any]) -> dict[str, Any]:
            return {k: v.detach().cpu() if isinstance(v, torch.Tensor) else v for k, v in values.items()}

        return {"callback_metrics": cpu(self.callback_metrics), "epoch_values": cpu(self.epoch_values),
                "epoch_flags": {k: list(flags) for k, flags in self.epoch_flags.items()}}

    def restore(self, saved: dict[str, Any]) -> None:
        """Hold the values of a ``snapshot`` as this run's latest."""
        self.epoch_values.update(saved["epoch_values"])
        self.epoch_flags.update({k: (bool(flags[0]), bool(flags[1])) for k, flags in saved["epoch_flags"].items()})
        self._callback_metrics.update(saved["callback_metrics"])

    @property
    def callback_metrics(self) -> dict[str, torch.Tensor]:
        """One dict, kept for the run: the latest step values and every epoch aggregate.

        It is the same dict on every read, so what a callback writes into it stays (until a
        newer logged value of the same name replaces it), as in Lightning.
        """
        self._callback_metrics.update(self.collector.step_values())
        self._callback_metrics.update(self.epoch_values)
        self._callback_metrics.update(self.training.newer_step_values())  # x: its latest step during the epoch
        return self._callback_metrics

    @property
    def logged_metrics(self) -> dict[str, torch.Tensor]:
        """The latest values logged with ``logger=True`` (step values under ``x_step``, epoch
        values under ``x_epoch`` when both were asked for), as Lightning's ``logged_metrics``."""
        values = dict(self.eval_step_logged)
        values.update(self.collector.step_values_for("logger"))
        values.update({k: v for k, v in self.epoch_values.items() if self.epoch_flags.get(k, (False, False))[1]})
        return values

    def stage_progress_bar_metrics(self) -> dict[str, float]:
        """The ``prog_bar`` values logged in the stage that runs now (a test's, not the last
        fit's): what its progress bar shows."""
        collector = self.collector
        values = collector.step_values_for("prog_bar")
        values.update({k: v for k, v in collector.epoch_values.items()
                       if collector.epoch_flags.get(k, (False, False))[0]})
        return {k: float(v) for k, v in values.items() if v.numel() == 1}

    @property
    def progress_bar_metrics(self) -> dict[str, float]:
        values = dict(self.eval_step_bar)
        values.update(self.collector.step_values_for("prog_bar"))
        values.update({k: v for k, v in self.epoch_values.items() if self.epoch_flags.get(k, (False, False))[0]})
        return {k: float(v) for k, v in values.items() if v.numel() == 1}
