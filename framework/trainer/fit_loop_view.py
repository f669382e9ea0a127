"""Lightning's ``trainer.fit_loop`` as a view of fw's run state and settings (fw has no loop
objects): its epoch progress, its step counters (``fit_loop.epoch_loop``) and the epoch and step
bounds, which may be set between fits as in Lightning (``trainer.fit_loop.max_epochs = 10``)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from framework.run_state.state import RunState


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
