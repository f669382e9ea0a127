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
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from framework.trainer.resume import ResumePoint

#: Why a fit stopped (``RunState.stop_reason``).
STOP_REASONS = ("max_epochs", "max_steps", "max_time", "should_stop", "preempted")


@dataclass
class RunState:
    """Progress of the current (or last) run.

    Attributes:
        fn: the call that runs: ``fit``, ``validate``, ``test``, ``predict`` (None between calls).
        stage: what runs now: ``sanity_check``, ``train``, ``validate``, ``test``, ``predict``.
        status: ``initializing``, ``running``, ``finished`` or ``interrupted``.
        epoch: the current epoch (0-based); Lightning's ``trainer.current_epoch``. An epoch cut
            short by a stop (``max_steps``, ``max_time``, ``should_stop``) still ends and counts,
            as in Lightning; the position below remembers that it was cut.
        global_step: optimizer steps taken so far (all epochs).
        batches_stepped: Lightning's ``_batches_that_stepped``: batches whose optimizer step
            ran (automatic optimization), or batches run (manual); loggers see step rows every
            ``log_every_n_steps`` of them, labelled ``log_step``, as in Lightning.
        position_epoch: the epoch that ``batches_done`` and ``epoch_finished`` refer to.
        fit_index: which fit of this program the last fit was (1, 2, ...; see checkpointing).
        batches_done: batches of ``position_epoch`` already trained on.
        epoch_finished: ``position_epoch`` ran to its end and its epoch-end work is under way
            (the position moves to the start of the next epoch right after).
        should_stop: a request to stop (callbacks, max_time) at the next check.
        skip_step: the optimizer step due next throws its gradients away (a non-finite loss
            under ``on_nonfinite=skip``).
        signal: a stop signal this process received (SIGTERM, SIGINT, the preemption signal),
            until the ranks agree to stop on it (see ``trainer/signals.py``).
        stop_reason: why the last fit stopped, one of ``STOP_REASONS``.
        epoch_start_rng: this rank's RNG state when ``epoch`` began (rebuilds its data order).
        cut: set when a stop cut the epoch short (see ``CutEpoch``).
        resume_from: where a resumed fit continues (``trainer/resume.ResumePoint``):
            set from a checkpoint, consumed by the first epoch.
        is_last_batch: the training batch being run is its epoch's last.
        ckpt_path: the checkpoint the current (or last) run started from, else None.
        eval_batches: evaluation batches run so far in this process (with the training position,
            the progress that ``trainer/heartbeat.py`` watches).
    """

    fn: str | None = None
    stage: str | None = None
    status: str = "initializing"
    epoch: int = 0
    global_step: int = 0
    batches_stepped: int = 0
    batches_done: int = 0
    epoch_finished: bool = False
    should_stop: bool = False
    skip_step: bool = False
    signal: int | None = None
    stop_reason: str | None = None
    position_epoch: int = 0
    fit_index: int = 0
    epoch_start_rng: dict | None = None
    cut: CutEpoch | None = None
    resume_from: ResumePoint | None = None
    eval_batches: int = 0
    is_last_batch: bool = False
    ckpt_path: str | None = None

    @property
    def mid_epoch(self) -> bool:
        """Some but not all batches of ``position_epoch`` are done: a checkpoint written now
        resumes inside it."""
        return self.batches_done > 0 and not self.epoch_finished

    def start_epoch(self, rng_state: dict) -> None:
        self.position_epoch, self.batches_done, self.epoch_finished = self.epoch, 0, False
        self.epoch_start_rng, self.cut = rng_state, None

    def finish_epoch(self) -> None:
        """The epoch ran to its end (its epoch-end hooks still see ``epoch``)."""
        self.epoch_finished = True

    def cut_epoch(self, rng_state: dict, metrics: dict) -> None:
        """A stop ends the epoch before its end: keep the RNG state right after its last batch
        and its running metric aggregates, so that a checkpoint written from now on resumes at
        the next batch as if the run had never stopped."""
        self.cut = CutEpoch(rng_state, metrics)

    def advance_epoch(self) -> None:
        """Count the epoch (finished or cut); a finished one moves the position on."""
        self.epoch += 1
        if self.epoch_finished:
            self.position_epoch, self.batches_done, self.epoch_finished = self.epoch, 0, False

    def stop(self, reason: str) -> None:
        """Record why the run stops (the first reason wins, but a signal wins over all: its
        stop writes a checkpoint and may requeue the job)."""
        assert reason in STOP_REASONS, reason
        self.stop_reason = reason if reason == "preempted" else self.stop_reason or reason

    # -- checkpoints ------------------------------------------------------------------------
    @property
    def log_step(self) -> int:
        """The step a logged row carries, Lightning's: during a fit, the batches that stepped
        before the current one (its rows, validation and epoch end all come before Lightning
        counts the batch); in a stand-alone validate/test, all of them."""
        return max(self.batches_stepped - 1, 0) if self.fn == "fit" else self.batches_stepped

    def progress(self) -> dict[str, Any]:
        """What a checkpoint keeps of the run's progress."""
        return {
            "epoch": self.position_epoch,
            "global_step": self.global_step,
            "batches_stepped": self.batches_stepped,
            "batches_done": self.batches_done,
            "epoch_finished": self.epoch_finished,
            "stop_reason": self.stop_reason,
        }

    def load_progress(self, saved: dict[str, Any], global_step: int | None = None) -> None:
        """Continue where ``progress()`` left off: at the next epoch if the saved one had
        finished, else in its middle (``resume_from`` is left for the caller to fill in)."""
        self.global_step = int(saved.get("global_step", global_step or 0))
        self.batches_stepped = int(saved.get("batches_stepped", self.global_step))
        finished = bool(saved["epoch_finished"])
        self.epoch = self.position_epoch = int(saved["epoch"]) + (1 if finished else 0)
        self.batches_done = 0 if finished else int(saved["batches_done"])
        self.epoch_finished = False
        self.should_stop, self.stop_reason, self.cut = False, None, None


@dataclass
class CutEpoch:
    """An epoch a stop ended early: the RNG state after its last trained batch, and its metric
    aggregates before the epoch end computed (and reset) them."""

    rng_after_last_batch: dict
    metrics: dict
