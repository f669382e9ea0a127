"""Stopping on a signal without losing anything: preemption (SIGTERM, the preemption signal,
SIGUSR1 by default, as ``sbatch --signal=USR1@90`` sends it) and Ctrl-C (SIGINT).

During a fit, ``SignalCatcher`` turns these signals into a request (``trainer.state.signal``);
the training loop reads the requests of all ranks together at its next stop check (every batch
in one process; distributed, every 20 batches or about every 5 s of training, whichever comes
first, and at each epoch end: ``StopCheck``), so that every rank
finishes the same step and stops there. Then every rank takes part in writing a checkpoint
(rank 0 writes ``preempted.ckpt``), under SLURM the job requeues itself if asked
(``trainer.requeue``), and the process exits with status 0 and a message that says how to
resume. A requeued or restarted job finds that checkpoint on its own.

Once the ranks stopped, the handlers stay until the process has written ``preempted.ckpt`` and
torn the run down (``SignalCatcher.hold``): a second SIGTERM (or preemption signal) waits for
the write and the exit that the first one asked for, instead of killing the process halfway
through the file (which left its temporary file behind, and no checkpoint of the stop).

A second Ctrl-C in a process that no launcher supervises stops at once (KeyboardInterrupt),
also during that write: the temporary file is removed and earlier checkpoints stay intact.
The handlers are installed for the fit only; the previous ones (and the signal mask) come back
after it. fw's launcher starts its workers with SIGUSR1 (the preemption signal) blocked, so that
one that arrives before the fit (SLURM sends it early: ``--signal=USR1@90``) waits for it instead
of killing the worker: the fit unblocks it, takes a waiting one as its stop request, and leaves it
unblocked.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from framework.errors import ProgramEnds
from framework.strategies.launchers.processes import BLOCKED_AT_START, launcher_lost
from framework.trainer.checkpointing import save
from framework.waiting import waiting_in

if TYPE_CHECKING:
    from framework.trainer.run import Run


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


class SignalCatcher:
    """Installs the stop handlers for the duration of a ``with`` block (main thread only), or
    past it until ``release()`` once ``hold()`` was called in it."""

    def __init__(self, run: Run) -> None:
        self.state = run.state
        self.rank = run.strategy.global_rank
        names = ["SIGTERM", "SIGINT"] + ([run.settings.preemption_signal] if run.settings.preemption_signal else [])
        self.signals = [getattr(signal, name) for name in dict.fromkeys(names)]
        self._previous: dict[int, Any] = {}
        self._mask: set[int | signal.Signals] | None = None  # the signal mask before the fit
        self._supervised = bool(os.environ.get("TORCHELASTIC_RUN_ID"))  # a launcher stops us if need be
        self._holding = False

    def __enter__(self) -> SignalCatcher:
        if threading.current_thread() is threading.main_thread():
            for signum in self.signals:
                self._previous[signum] = signal.signal(signum, self._handle)
            # a program may block them until it can handle them (fw's launcher starts its workers
            # so: a signal that arrives while they start, as Slurm's may); one that waits comes in now
            self._mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, self.signals)
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self._holding:
            self.release()

    def hold(self) -> None:
        """Keep the handlers past the ``with`` block: the run stopped on a signal and is about to
        write its checkpoint and exit; a stop signal from now on waits for that."""
        self._holding = True

    def release(self) -> None:
        """Put the previous signal mask and handlers back (once; again is a no-op). What fw's
        launcher blocked for the worker's start stays unblocked: it was only to reach a fit."""
        if self._mask is not None:
            launcher_blocked = {getattr(signal, name) for name in os.environ.get(BLOCKED_AT_START, "").split(",") if name}
            signal.pthread_sigmask(signal.SIG_SETMASK, self._mask - launcher_blocked)
            self._mask = None
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()
        self._holding = False

    def _handle(self, signum: int, frame: Any) -> None:
        if self._holding:
            self._while_writing(signum)
        elif self.state.signal is None:
            self.state.signal = signum
            if signum == signal.SIGTERM and launcher_lost():  # the kernel's SIGTERM: as_launcher_worker
                self.state.lost_node = int(os.environ.get("GROUP_RANK") or 0)
                sys.stderr.write(f"fw: rank {self.rank} lost its launcher (node {self.state.lost_node}): stopping "
                                 "after this step and writing a checkpoint\n")
            else:
                sys.stderr.write(f"fw: rank {self.rank} received {signal_name(signum)}: stopping after this step "
                                 "and writing a checkpoint\n")
            sys.stderr.flush()
        elif signum == signal.SIGINT and not self._supervised:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now

    def _while_writing(self, signum: int) -> None:
        if signum == signal.SIGINT and not self._supervised:
            sys.stderr.write(f"fw: rank {self.rank} received SIGINT again: stopping now, without preempted.ckpt "
                             "(its temporary file is removed; earlier checkpoints are intact)\n")
            sys.stderr.flush()
            raise KeyboardInterrupt
        sys.stderr.write(f"fw: rank {self.rank} received {signal_name(signum)} again: the stop is under way "
                         "(writing preempted.ckpt, then exiting); it finishes first\n")
        sys.stderr.flush()


class StopCheck:
    """Has any rank received a stop signal, or has ``max_time`` passed on any rank? If so, every
    rank records the stop (``preempted`` wins over ``max_time``).

    In one process the loop asks after every batch. Distributed, the answer is a collective
    (every rank asks at the same batch), so the loop asks every ``every`` batches: as rarely as
    every 20 batches, but at least about every 5 s of training, because a launcher that passes
    on SIGTERM waits only so long (30 s for torch's agent) before it kills the workers. The
    ranks agree on ``every``: the check's all-reduce carries each rank's seconds per batch since
    the last check, and all derive the next interval from the largest.

    Between batches the question goes out without waiting (``after_batch``): asked after batch
    ``k - 1``, its answer is read after batch ``k``, where every rank stops if any rank had a
    stop by the end of batch ``k - 1``; meanwhile the collective completes beside the training
    step, and no rank waits for the slowest one to reach it. At an epoch's end the loop asks and
    waits (``__call__``).
    """

    TARGET_S, MOST = 5.0, 20

    def __init__(self, run: Run) -> None:
        self.run = run
        self.deadline: float | None = None  # when max_time is up (time.monotonic()); None without one
        self.distributed = run.strategy.is_distributed
        self.every = 1
        self._since = time.monotonic()
        self._pending: Callable[[], torch.Tensor] | None = None  # the question asked after the last batch

    def start_clock(self) -> None:
        """Training starts now: ``max_time`` counts from here (set-up and sanity check excluded)."""
        max_time = self.run.settings.max_time
        self.deadline = time.monotonic() + max_time if max_time is not None else None
        self._since = time.monotonic()
        if max_time == 0:  # up before the first batch: no step (Lightning's Timer checks at fit start)
            self.run.state.should_stop = True
            self.run.state.stop("max_time")
        elif self.distributed:  # a stop from before the fit (a signal that waited for it): read after batch 0
            self._pending = self.run.strategy.all_reduce_later(self._ask(batches=0), "max")

    def finish(self) -> None:
        """Training ended: a question still out is answered (a fit that ran no epoch)."""
        self._read_pending()

    def after_batch(self, batch_idx: int) -> bool:
        """After training batch ``batch_idx`` (every rank calls it for the same batches): stop
        now? Distributed, reads the answer asked after the previous batch, if one was, and asks
        again when the batch after this one is due for an answer."""
        if not self.distributed:
            code = self._code()  # without _mine()'s bookkeeping, which only a collective reads
            return self._apply(code) if code else False
        stop = self._read_pending()
        if (batch_idx + 2) % self.every == 0:
            self._pending = self.run.strategy.all_reduce_later(self._ask(self.every), "max")
        return stop

    def __call__(self) -> bool:
        """Stop now? Asks every rank and waits for the answer (an epoch's end); a question still
        out from the last batch is answered first."""
        if not self.distributed:
            return self._apply(self._mine()[0])
        stop = self._read_pending()
        return self._answer(self.run.strategy.all_reduce_later(self._ask(self.every), "max")) or stop

    def _code(self) -> int:
        """This rank's stop code: 0 none, 1 max_time, 2 a signal, 3 + n node n lost its launcher
        (the ranks' largest such code names one of them)."""
        state = self.run.state
        if state.lost_node is not None:
            return 3 + state.lost_node
        if state.signal is not None:
            return 2
        return 1 if self.deadline is not None and time.monotonic() > self.deadline else 0

    def _mine(self, batches: int = 1) -> tuple[int, float]:
        """This rank's stop code (``_code``) and its seconds per batch over the ``batches`` since
        the last question (0: none, nothing measured)."""
        now = time.monotonic()
        per_batch = (now - self._since) / batches if batches else 0.0  # at an epoch's end, fewer: an overestimate
        self._since = now
        return self._code(), per_batch

    def _ask(self, batches: int) -> torch.Tensor:
        return torch.tensor(self._mine(batches), dtype=torch.float64, device=self.run.strategy.collective_device)

    def _read_pending(self) -> bool:
        """The answer to the question still out, if one is (False: none is)."""
        pending, self._pending = self._pending, None
        return self._answer(pending) if pending is not None else False

    def _answer(self, result: Callable[[], torch.Tensor]) -> bool:
        """Wait for ``result`` (the ranks' largest stop code and seconds per batch) and act on it."""
        with waiting_in("the stop check (stop signals, max_time)"):
            mine, per_batch = result().tolist()
        if per_batch > 0:
            self.every = max(1, min(self.MOST, int(self.TARGET_S / per_batch)))
        return self._apply(int(mine))

    def _apply(self, mine: int) -> bool:
        state = self.run.state
        if mine >= 3:
            state.lost_node, mine = mine - 3, 2
        if mine:
            state.should_stop = True
            state.stop("preempted" if mine == 2 else "max_time")
        return bool(mine)


class StoppedBySignal(ProgramEnds):
    """A fit stopped on a stop signal and wrote ``preempted.ckpt``: the program ends with status
    0 (the job was asked to end; the code after ``fit`` would run on a half-trained model)."""


def save_after_signal(run: Run) -> None:
    """After the ranks stopped on a signal: every rank helps write ``preempted.ckpt`` (in the
    first ModelCheckpoint's folder, else ``default_root_dir``), SLURM requeues the job if asked,
    and rank 0 says where the checkpoint is."""
    from framework.rank_zero import rank_zero_info

    dirs = [path for cb in run.callbacks if (path := getattr(cb, "dirpath", None))]
    path = os.path.join(dirs[0] if dirs else run.settings.default_root_dir, "preempted.ckpt")
    save(run, path)
    requeued = requeue_slurm_job() if run.settings.requeue and run.strategy.is_global_zero else None
    name = signal_name(run.state.signal) if run.state.signal else "a signal to another rank"
    if run.state.lost_node is not None:
        name = f"the loss of node {run.state.lost_node}'s launcher"
    rank_zero_info(f"fw: stopped by {name} at step {run.state.global_step}; checkpoint {path}"
                    + (f"; {requeued}" if requeued else f"; resume with ckpt_path={path}"))


def requeue_slurm_job() -> str:
    """``scontrol requeue $SLURM_JOB_ID``; returns what happened, in words."""
    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        return "not a SLURM job: nothing to requeue"
    try:
        done = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as err:
        return f"scontrol requeue {job} failed: {err}"
    if done.returncode != 0:
        return f"scontrol requeue {job} failed: {done.stderr.strip() or done.returncode}"
    return f"SLURM job {job} requeued"
