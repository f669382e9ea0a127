"""``RunState``: where a run stands, as one value.

The Trainer owns one ``RunState`` (``trainer.state``); the loops advance it, callbacks read it
through the Trainer's properties (``current_epoch``, ``global_step``, ``should_stop``,
``sanity_checking``), and a checkpoint saves its ``progress()`` and restores it with
``load_progress()``, as one piece. Nothing else about a run's progress lives anywhere else.

``fn`` and ``stage`` use Lightning's values (``trainer.state.fn == "fit"``,
``trainer.state.stage == "sanity_check"``), so code written against Lightning's ``TrainerFn``
and ``RunningStage`` (string enums) compares equal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Why a fit stopped (``RunState.stop_reason``).
STOP_REASONS = ("max_epochs", "max_steps", "max_time", "should_stop")


@dataclass
class RunState:
    """Progress of the current (or last) run.

    Attributes:
        fn: the call that runs: ``fit``, ``validate``, ``test``, ``predict`` (None between calls).
        stage: what runs now: ``sanity_check``, ``train``, ``validate``, ``test``, ``predict``.
        status: ``initializing``, ``running``, ``finished`` or ``interrupted``.
        epoch: the current epoch (0-based); Lightning's ``trainer.current_epoch``.
        global_step: optimizer steps taken so far (all epochs).
        batches_done: batches of ``epoch`` already trained on (the position in the epoch).
        epoch_finished: ``epoch`` ran to its end and its epoch-end work is under way (the state
            moves to the next epoch right after).
        should_stop: a request to stop (callbacks, max_time) at the next check.
        stop_reason: why the last fit stopped, one of ``STOP_REASONS``.
        epoch_start_rng: this rank's RNG state when ``epoch`` began (rebuilds its data order).
        resume_from: batches of ``epoch`` to skip on a mid-epoch resume, and the RNG state to
            put back after skipping them (set by ``Trainer`` from a checkpoint, consumed once).
    """

    fn: str | None = None
    stage: str | None = None
    status: str = "initializing"
    epoch: int = 0
    global_step: int = 0
    batches_done: int = 0
    epoch_finished: bool = False
    should_stop: bool = False
    stop_reason: str | None = None
    epoch_start_rng: dict | None = None
    resume_from: ResumePoint | None = None

    def start_epoch(self, rng_state: dict) -> None:
        self.batches_done, self.epoch_finished, self.epoch_start_rng = 0, False, rng_state

    def finish_epoch(self) -> None:
        """The epoch ran to its end (its epoch-end hooks still see ``epoch``)."""
        self.epoch_finished = True

    def advance_epoch(self) -> None:
        self.epoch, self.batches_done, self.epoch_finished = self.epoch + 1, 0, False

    def stop(self, reason: str) -> None:
        """Record why the run stops (the first reason wins)."""
        assert reason in STOP_REASONS, reason
        self.stop_reason = self.stop_reason or reason

    # -- checkpoints ------------------------------------------------------------------------
    def progress(self) -> dict[str, Any]:
        """What a checkpoint keeps of the run's progress."""
        return {
            "epoch": self.epoch,
            "global_step": self.global_step,
            "batches_done": self.batches_done,
            "epoch_finished": self.epoch_finished,
            "stop_reason": self.stop_reason,
        }

    def load_progress(self, saved: dict[str, Any], global_step: int | None = None) -> None:
        """Continue where ``progress()`` left off: at the next epoch if the saved one had
        finished, else in its middle (``resume_from`` is left for the caller to fill in)."""
        self.global_step = int(saved.get("global_step", global_step or 0))
        finished = bool(saved["epoch_finished"])
        self.epoch = int(saved["epoch"]) + (1 if finished else 0)
        self.batches_done = 0 if finished else int(saved["batches_done"])
        self.epoch_finished = False
        self.should_stop, self.stop_reason = False, None


@dataclass
class ResumePoint:
    """A mid-epoch resume: skip ``batches`` batches (drawn in the saved order), then put back
    ``rng_after_skip`` so that the run continues with the RNG it had when it was saved."""

    batches: int
    rng_after_skip: dict | None = None
