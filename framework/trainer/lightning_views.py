"""The rest of the Trainer's Lightning names that Lightning code reads: ``trainer.precision`` (the
name), ``scaler``, ``fit_loop`` (its epoch progress and limits), the loaders and the per-loader
batch counts, and the stage and signal flags. Each means what Lightning's does; kept apart from
``properties.py`` so that each file stays one concept (these are views of Lightning's loop
objects, which fw does not have)."""

from __future__ import annotations

import dataclasses
import signal
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from framework.precision import Precision
    from framework.strategies import Strategy
    from framework.trainer.run import Run
    from framework.trainer.settings import Settings
    from framework.trainer.state import RunState


@dataclasses.dataclass(frozen=True)
class Tracker:
    """Lightning's ``_ProcessedTracker``: how many epochs were made ready, started (their
    ``on_train_epoch_start`` ran), processed (their batches ran) and completed."""

    ready: int
    started: int
    processed: int
    completed: int


@dataclasses.dataclass(frozen=True)
class EpochProgress:
    """Lightning's ``fit_loop.epoch_progress``; ``total`` and ``current`` are equal in fw (a resumed
    run continues the counts it saved, as Lightning's do)."""

    total: Tracker
    current: Tracker


class EpochLoopView:
    """Lightning's ``trainer.fit_loop.epoch_loop``: the step counters."""

    def __init__(self, trainer: Any) -> None:
        self._trainer = trainer

    @property
    def global_step(self) -> int:
        return self._trainer.state.global_step

    @property
    def max_steps(self) -> int:
        return self._trainer.settings.max_steps

    @property
    def _batches_that_stepped(self) -> int:
        return self._trainer.state.batches_that_stepped

    @property
    def batch_idx(self) -> int:
        """The index in its epoch of the training batch running, or of the last one run."""
        return self._trainer.state.batch_idx


class FitLoopView:
    """Lightning's ``trainer.fit_loop``: ``epoch_progress``, the epoch and step bounds (which
    may be set between fits, as in Lightning: ``trainer.fit_loop.max_epochs = 10``)."""

    def __init__(self, trainer: Any) -> None:
        self._trainer = trainer
        self.epoch_loop = EpochLoopView(trainer)

    @property
    def epoch_progress(self) -> EpochProgress:
        state: RunState = self._trainer.state
        epoch, phase = state.epoch, state.epoch_phase
        tracker = Tracker(ready=epoch + (phase >= 1), started=epoch + (phase >= 2), processed=epoch + (phase >= 3),
                          completed=epoch)
        return EpochProgress(total=tracker, current=tracker)

    def _setting(self, name: str) -> Any:
        return getattr(self._trainer.settings, name)

    def _change(self, name: str, value: int) -> None:
        """The next fit's bound (and the running fit's, read at its next epoch)."""
        trainer = self._trainer
        trainer.settings = dataclasses.replace(trainer.settings, **{name: int(value)})
        if trainer.run is not None:
            trainer.run.settings = trainer.settings

    max_epochs = property(lambda self: self._setting("max_epochs"), lambda self, v: self._change("max_epochs", v))
    min_epochs = property(lambda self: self._setting("min_epochs"), lambda self, v: self._change("min_epochs", v))
    max_steps = property(lambda self: self._setting("max_steps"), lambda self, v: self._change("max_steps", v))
    min_steps = property(lambda self: self._setting("min_steps"), lambda self, v: self._change("min_steps", v))


class LightningViews:
    """Mixed into ``Trainer``."""

    settings: Settings
    strategy: Strategy
    state: RunState
    run: Run | None
    last_fit: Run | None
    batch_counts: dict[str, list[int | float]]
    precision_plugin: Precision
    fit_loop: FitLoopView

    @property
    def precision(self) -> str:
        """Lightning's name of the run's precision: ``32-true``, ``bf16-mixed``, ``16-mixed``,
        ``64-true``, ``bf16-true`` or ``16-true`` (the object is ``precision_plugin``)."""
        return self.precision_plugin.precision

    @property
    def scaler(self) -> torch.amp.GradScaler | None:
        """The ``GradScaler`` of ``16-mixed`` (None under other precisions)."""
        return self.precision_plugin.scaler

    @property
    def received_sigterm(self) -> bool:
        """Whether the current (or last) fit received SIGTERM, which stops it with a checkpoint."""
        return self.state.signal == signal.SIGTERM

    @property
    def evaluating(self) -> bool:
        """Whether a validation, test or sanity check runs now."""
        return self.state.stage in ("validate", "test", "sanity_check")

    @property
    def enable_validation(self) -> bool:
        """Lightning's: the module has a ``validation_step`` and validation data (given, or a
        ``val_dataloader()``), and ``limit_val_batches`` is not 0."""
        from framework.data import DataModule
        from framework.loops.hooks import overrides
        from framework.module import TrainModule

        run = self.run
        if run is None or not overrides(run.module, TrainModule, "validation_step") \
                or self.settings.limits["validate"] == 0:
            return False
        source = run.loader_source
        given = source is not None and source.given.get("validate") is not None
        defined = overrides(run.datamodule, DataModule, "val_dataloader") if run.datamodule is not None \
            else overrides(run.module, TrainModule, "val_dataloader")
        return bool(run.loaders.get("validate")) or given or defined

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int] | None:
        """How a sampler shards the data over this job (None in one process)."""
        strategy = self.strategy
        if not strategy.multi_process:
            return None
        return {"num_replicas": strategy.data_parallel_size, "rank": strategy.data_parallel_rank}

    # -- the data: the loaders are the current (or last) call's; the batch counts, as Lightning's loops
    # keep theirs from one call to the next, the last call's of that kind (the fit's from its loaders)
    def _loaders_of(self, key: str) -> Any:
        found = (self.run.loaders.get(key) if self.run is not None else None) or []
        return found[0] if len(found) == 1 else (found or None)

    @property
    def train_dataloader(self) -> Any:
        """The current (or last) call's training loader (None without one)."""
        return self._loaders_of("train")

    @property
    def val_dataloaders(self) -> Any:
        """The current (or last) call's validation loader, a list of them for several, or None."""
        return self._loaders_of("validate")

    @property
    def test_dataloaders(self) -> Any:
        """The current (or last) call's test loader, a list of them for several, or None."""
        return self._loaders_of("test")

    @property
    def predict_dataloaders(self) -> Any:
        """The current (or last) call's prediction loader, a list of them for several, or None."""
        return self._loaders_of("predict")

    def _batches_per_loader(self, fn: str, stage: str) -> list[int | float]:
        """Batches per ``stage`` loader of the last ``fn`` call (the current one, if it is one):
        a fit's from its loaders (reloaded ones too), the others' as their set-up counted them."""
        from framework.loops.batches import num_batches

        if fn != "fit":
            return list(self.batch_counts.get(fn, []))
        loaders = (self.last_fit.loaders.get(stage) if self.last_fit is not None else None) or []
        return [num_batches(loader, self.settings.limits[stage]) for loader in loaders]

    @property
    def num_val_batches(self) -> list[int | float]:
        """Validation batches per loader (Lightning's list): in a ``validate`` call and after it
        (until the next call) that call's, else the last fit's."""
        return self._batches_per_loader("validate" if self.state.fn == "validate" else "fit", "validate")

    @property
    def num_sanity_val_batches(self) -> list[int | float]:
        """The last fit's sanity check's batches per validation loader."""
        steps = self.settings.num_sanity_val_steps
        return [min(float("inf") if steps == -1 else steps, n)  # -1: all of them
                for n in self._batches_per_loader("fit", "validate")]

    @property
    def num_test_batches(self) -> list[int | float]:
        """Test batches per loader of the last ``test`` call (``inf`` for a loader without a length)."""
        return self._batches_per_loader("test", "test")

    @property
    def num_predict_batches(self) -> list[int | float]:
        """Prediction batches per loader of the last ``predict`` call (as ``num_test_batches``)."""
        return self._batches_per_loader("predict", "predict")

    @property
    def val_check_batch(self) -> int | float | None:
        """Training batches between validations inside an epoch (None before a fit's training
        starts; the last fit's after it, as in Lightning)."""
        limit = self.last_fit.fit_batches if self.last_fit is not None else None
        if limit is None:  # as Lightning: known once a fit's training starts
            return None
        interval = self.settings.val_check_interval
        if interval is None or (isinstance(interval, float) and interval == 1.0):
            return limit
        return max(1, int(limit * interval)) if isinstance(interval, float) else int(interval)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on each machine's first process only, as Lightning's ``trainer.print``."""
        if self.strategy.local_rank == 0:
            print(*args, **kwargs)  # noqa: T201 - the user's own print, as in Lightning
