"""``RunState``: where a run stands, as one value.

The Trainer owns one ``RunState`` (``trainer.state``); the loops advance it, callbacks read it
through the Trainer's properties (``current_epoch``, ``global_step``, ``should_stop``,
``sanity_checking``). The training's position in its data is ``position`` (``position.py``); how a
checkpoint gets back to both is the Trainer's (``framework/trainer/resume.py``).

``fn`` and ``stage`` use Lightning's values (``trainer.state.fn == "fit"``,
``trainer.state.stage == "sanity_check"``), so code written against Lightning's ``TrainerFn``
and ``RunningStage`` (string enums) compares equal.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from framework.run_state.position import DataPosition

#: the stage each call runs in, from its start to its end (hooks included; the loops set the sanity
#: check and a fit's validations), as in Lightning
RUNNING_STAGE = {"fit": "train", "validate": "validate", "test": "test", "predict": "predict"}
#: Why a fit stopped (``RunState.stop_reason``).
STOP_REASONS = ("max_epochs", "max_steps", "max_time", "should_stop", "preempted", "no_training_batches")


@dataclass
class RunState:
    """Progress of the current (or last) run. One counter per meaning:

    Attributes:
        fn: the call that runs, or ran last: ``fit``, ``validate``, ``test``, ``predict`` (None before the first).
        stage: what runs now: ``sanity_check``, ``train``, ``validate``, ``test``, ``predict`` (None between calls).
        status: ``initializing``, ``running``, ``finished`` or ``interrupted``.
        epoch: the current epoch (0-based); Lightning's ``trainer.current_epoch``. An epoch cut
            short by a stop (``max_steps``, ``max_time``, ``should_stop``) still ends and counts,
            as in Lightning; ``position`` remembers that it was cut.
        epoch_phase: how far the current epoch is: 0 not begun, 1 begun (its
            ``on_train_epoch_start`` runs), 2 running batches, 3 batches done (its end hooks run);
            what ``trainer.fit_loop.epoch_progress`` reports, as Lightning counts it.
        batch_idx: the index in its epoch of the training batch running, or of the last one run
            (until the next epoch's first batch); -1 before any. Lightning's
            ``fit_loop.epoch_loop.batch_idx``.
        global_step: optimizer steps taken so far (all epochs).
        batches_that_stepped: Lightning's ``_batches_that_stepped``: batches whose optimizer step
            ran (automatic optimization), or batches run (manual); loggers see step rows every
            ``log_every_n_steps`` of them, labelled ``logger_step``, as in Lightning.
        log_due: the training batch that just ran is one whose step values are logged (its
            ``batches_that_stepped`` is a multiple of ``log_every_n_steps``, or a stop was asked
            for): the one counter behind ``self.log``'s step rows and every callback that logs
            per step (ThroughputMonitor, StepTimeBreakdown), all at ``logger_step``.
        eval_batches: evaluation batches run so far in this process (with the training position,
            the progress that ``trainer/heartbeat.py`` watches).
        position: where the training stands in its data (``position.DataPosition``).
        fit_index: which fit of this program the last fit was (1, 2, ...; see checkpointing).
        run_id: the elastic job the last fit ran in, as its checkpoints name it
            (``rendezvous.elastic_job_id``); None outside the elastic agent.
        should_stop: a request to stop (callbacks, max_time) at the next check.
        skip_step: the optimizer step due next throws its gradients away (a non-finite loss
            under ``on_nonfinite=skip``).
        forward_only: the training epoch about to start runs ``training_step`` alone: no
            backward, no optimizer or scheduler step, no step counted (read as each epoch starts,
            after ``on_train_epoch_start``; StochasticWeightAveraging's BatchNorm epoch sets it).
        signal: a stop signal this process received (SIGTERM, SIGINT, the preemption signal),
            until the ranks agree to stop on it (see ``trainer/preemption.py``).
        lost_node: the node whose launcher died during the fit (its workers got SIGTERM from the
            kernel), as the ranks learnt it at their stop check; None otherwise.
        stop_reason: why the last fit stopped, one of ``STOP_REASONS``.
        is_last_batch: the training batch being run is its epoch's last.
        ckpt_path: the checkpoint the current (or last) run started from, else None.
        uncounted_batch: ``(epoch, batch_idx)`` of the last training batch that only accumulated
            (not counted in ``batches_that_stepped``: ``logger_step`` tells it apart).
    """

    fn: str | None = None
    stage: str | None = None
    status: str = "initializing"
    epoch: int = 0
    epoch_phase: int = 0
    batch_idx: int = -1
    global_step: int = 0
    batches_that_stepped: int = 0
    log_due: bool = False
    eval_batches: int = 0
    position: DataPosition = field(default_factory=DataPosition)
    fit_index: int = 0
    run_id: str | None = None
    should_stop: bool = False
    skip_step: bool = False
    forward_only: bool = False
    signal: int | None = None
    lost_node: int | None = None
    stop_reason: str | None = None
    is_last_batch: bool = False
    ckpt_path: str | None = None
    uncounted_batch: tuple[int, int] | None = None

    def advance_epoch(self) -> None:
        """Count the epoch (finished or cut); a finished one moves the position on."""
        self.epoch += 1
        self.epoch_phase = 0
        self.position.move_on(self.epoch)

    def stop(self, reason: str) -> None:
        """Record why the run stops (the first reason wins, but a signal wins over all: its
        stop writes a checkpoint and may requeue the job)."""
        assert reason in STOP_REASONS, reason
        self.stop_reason = reason if reason == "preempted" else self.stop_reason or reason

    @property
    def logger_step(self) -> int:
        """The step a logged row carries, Lightning's: during a fit, the batches that stepped
        before the current one (its rows, validation and epoch end all come before Lightning
        counts the batch, and a batch that only accumulates is never counted); in a stand-alone
        validate/test, all of them."""
        if self.fn != "fit":
            return self.batches_that_stepped
        counted = self.uncounted_batch != (self.epoch, self.batch_idx)
        return max(self.batches_that_stepped - counted, 0)
