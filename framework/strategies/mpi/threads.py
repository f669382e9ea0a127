"""The two threads of an ``MPIProcessGroup`` (``process_group.py``): the watchdog that bounds every
MPI call by the group's timeout, and the communication thread that runs the all-reduces a caller
waits for later (DDP's gradient buckets), in order, while the caller goes on computing.

The watchdog's reports name the line of the user's code each rank is at (``framework/stacks.py``):
a waiting rank its own, and that of each rank that had not arrived, which it asks for over the
roll call (``rollcall.py``); a rank asked so says it in its own log too.
"""

from __future__ import annotations

import atexit
import collections
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TextIO

import torch
import torch.distributed as dist

from framework import stacks, waiting
from framework.strategies.mpi.rollcall import RollCall, describe_absent


def call_unwatched(_what: str, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return call(*args, **kwargs)


class Watchdog:
    """Bounds every MPI call of a group by ``timeout`` (MPI has no timeout of its own).

    A call marks its thread busy (``watching``: one dict write, no lock); a daemon thread looks
    once a second, reports a wait every 30 s (or a third of the timeout) on stderr, and past the
    timeout aborts the whole MPI job: a rank that stopped answering (SIGSTOP, a dead node, a
    deadlock) would otherwise keep the others waiting forever. One entry per thread, as the
    communication thread and the caller's (a ``recv``) can both wait at once.
    """

    def __init__(self, rank: int, size: int, timeout_s: float, roll: RollCall | None = None) -> None:
        self.where, self.timeout_s = f"rank {rank} of {size}", timeout_s
        self.report_every = min(30.0, timeout_s / 3)  # as the heartbeat (trainer/heartbeat.py)
        self.roll = roll  # who else waits: names the ranks that did not arrive (None: not named)
        self._waits: dict[int, tuple[str, float]] = {}  # thread id -> (what, since)
        self._announced: tuple[int, str, float] | None = None  # (thread, what, since): the wait the peers know of
        self._telling = threading.Lock()
        self._next_own = 0.0  # when this rank may next say where it is, asked by a waiting peer
        self._thread = threading.Thread(target=self._watch, name="fw-mpi-watchdog", daemon=True)
        self._thread.start()

    def watching(self, what: str, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        me = threading.get_ident()
        if me in self._waits:  # a call made by another watched call
            return call(*args, **kwargs)
        self._waits[me] = (what, time.monotonic())
        try:
            return call(*args, **kwargs)
        finally:
            del self._waits[me]
            if self._announced is not None:  # told now, not at the watchdog's next look: this
                self._told_done(me)  # rank may stop or hang (outside MPI) within that second

    def _watch(self) -> None:
        next_report: dict[tuple, float] = {}  # (thread, what, since) -> seconds waited at the next report
        while True:
            time.sleep(min(1.0, self.report_every / 2))
            now = time.monotonic()
            current = [(tid, what, since) for tid, (what, since) in self._waits.copy().items()]
            self._tell_peers(current, now)
            next_report = {w: next_report.get(w, self.report_every) for w in current}
            for (tid, what, since), at in list(next_report.items()):
                waited = now - since
                if waited > self.timeout_s:
                    self._abort(f"fw: error: {self.where} waited {waited:.0f} s in MPI {_for_what(what)} for the "
                                f"other ranks (timeout {self.timeout_s:g} s, trainer.strategy.timeout): "
                                f"{self._who()}; aborting the MPI job")
                if waited >= at:
                    next_report[tid, what, since] = at + self.report_every
                    self._await_answers(1.0)
                    line = stacks.main_thread().line
                    at_line = f", at {line}," if line else ""
                    stream = _real_stderr()
                    stream.write(f"fw: {self.where} has waited {waited:.0f} s in MPI {_for_what(what)} for the "
                                 f"other ranks{at_line} (aborting after {self.timeout_s:g} s, trainer.strategy.timeout): "
                                 f"{self._who()}\n")
                    stream.flush()

    def _tell_peers(self, waits: list[tuple[int, str, float]], now: float) -> None:
        """Tell the peers of a wait longer than a second (its end is told by the waiting thread
        itself, in ``watching``); read what they said."""
        if self.roll is None:
            return
        long = [w for w in waits if now - w[2] >= 1.0]
        if long and self._announced is None:
            with self._telling:
                wait = self._announced = min(long, key=lambda w: w[2])
                if self._waits.get(wait[0]) == wait[1:]:  # still waiting: else its thread saw None
                    self.roll.answers.clear()  # where the peers were in an earlier wait: asked again below
                    self.roll.announce(wait[1])
                else:
                    self._announced = None
        self.roll.read()
        self._answer(now)
        announced = self._announced
        if announced is not None:  # waiting long: ask the ranks not heard waiting where they are
            absent = self.roll.absent_peers()
            if absent:
                self.roll.ask(absent, now - announced[2])

    def _await_answers(self, wait_s: float) -> None:
        """Before a report: give the ranks not heard waiting up to ``wait_s`` to answer where they
        are (asked since this wait's first second, they answer at their watchdog's next look)."""
        end = time.monotonic() + wait_s
        while self.roll is not None and time.monotonic() < end:
            if all(peer in self.roll.answers for peer in self.roll.absent_peers()):
                return
            time.sleep(0.05)

    def _answer(self, now: float) -> None:
        """Tell the peers that asked where this rank is; say it in this rank's own log too once
        one of them has waited a report's time (at most once a report's time)."""
        assert self.roll is not None
        questions, self.roll.questions = self.roll.questions, {}
        if not questions:
            return
        place = _place()
        for asker in questions:
            self.roll.answer(asker, place)
        asker, waited = max(questions.items(), key=lambda q: q[1])
        if waited >= self.report_every and now >= self._next_own:
            self._next_own = now + self.report_every
            what = self.roll.waiting.get(asker, "a call")
            stream = _real_stderr()
            stream.write(f"fw: {self.where} is {place}, and rank {self.roll.world_ranks[asker]} has waited "
                         f"{waited:.0f} s for it in MPI {what} (aborting after {self.timeout_s:g} s, "
                         "trainer.strategy.timeout)\n")
            stream.flush()
    def _told_done(self, thread: int) -> None:
        with self._telling:
            if self.roll is not None and self._announced is not None and self._announced[0] == thread:
                self._announced = None
                self.roll.announce(None)

    def _who(self) -> str:
        if self.roll is None:
            return "a rank stopped answering (which one is not known below MPI_THREAD_MULTIPLE)"
        return describe_absent(self.roll.absent(), self.roll.where_absent())

    def _abort(self, message: str) -> None:
        from mpi4py import MPI

        stream = _real_stderr()
        stream.write(message + "\n")
        stream.flush()
        time.sleep(0.5)  # let the launcher forward the line before the abort tears it down
        MPI.COMM_WORLD.Abort(1)


def _for_what(what: str) -> str:
    """'all-reduce (the backward pass's gradient sync)': the MPI call, and what the main thread's
    marks say it is for (``framework.waiting``), unless the main thread is in the user's code."""
    marks = waiting.now()
    return f"{what} ({marks})" if marks and not waiting.in_user_code() else what


def _place() -> str:
    """Where the main thread is: 'in training_step, at job.py:42 time.sleep(600) in training_step'
    (its marks, ``framework.waiting``, and the user's line, asked of a loader worker where it
    waits for a batch)."""
    marks, line = waiting.now(), stacks.main_thread(workers=True).line
    place = ", ".join(([f"in {marks}"] if marks else []) + ([f"at {line}"] if line else []))
    return place or "in fw's own code (no mark, no line of the user's)"


def _real_stderr() -> TextIO:
    """The process's own stderr (``sys.__stderr__``: torch's excepthook may have swapped
    ``sys.stderr`` for a buffer), or ``sys.stderr`` in a process started without one."""
    return sys.__stderr__ or sys.stderr


def _outcome(done: torch.futures.Future) -> Any:
    """A queued call's result, or its exception raised: as a ``then`` callback this marks the
    caller's future failed in C++, where DDP reads it (``Future.set_exception`` would not)."""
    error, result = done.value()
    if error is not None:
        raise error
    return result


class QueuedWork(dist.Work):
    """The ``Work`` of a call on the communication thread; ``wait()`` raises the call's error
    (the ``Work`` that ``_create_work_from_future`` makes returns True regardless)."""

    def __init__(self, fut: torch.futures.Future) -> None:
        super().__init__()
        self._fut = fut

    def wait(self, timeout: timedelta | None = None) -> bool:  # the watchdog bounds the call itself
        self._fut.wait()
        return True

    def is_completed(self) -> bool:
        return self._fut.done()

    def get_future(self) -> torch.futures.Future:
        return self._fut


class CommThread:
    """Runs a group's asynchronous calls one at a time, in the order they were submitted.

    Every rank must issue the collectives of a communicator in the same order: one thread fed
    by a FIFO queue keeps the callers' order, and a synchronous call first waits for the queue
    to empty (``drain``), then runs on the caller's thread. A call's ``Work`` completes (with
    ``result``, or the call's exception) once the call has returned, and its future's callbacks
    run on this thread. The thread holds no reference to the group, and none to a call's
    tensors once the call is done.
    """

    def __init__(self, run: Callable[..., Any]) -> None:
        self._run = run  # run(what, call, *args): the group's watched call
        self._queue: collections.deque = collections.deque()
        lock = threading.Lock()
        self._submitted, self._idle = threading.Condition(lock), threading.Condition(lock)
        self._pending = 0  # submitted and not finished
        self._thread = threading.Thread(target=self._loop, name="fw-mpi-comm", daemon=True)
        self._thread.start()
        atexit.register(self.stop)

    def stop(self) -> None:
        """Finish the queued calls and end the thread. Called at exit: a daemon thread still
        inside torch's C++ code (completing a future) when Python finalises aborts the process."""
        with self._submitted:
            self._queue.append(None)
            self._submitted.notify()
        self._thread.join()  # a call stuck in MPI ends with the watchdog's abort

    def is_current(self) -> bool:
        return threading.get_ident() == self._thread.ident

    def submit(self, what: str, result: Any, call: Callable[..., Any], *args: Any) -> dist.Work:
        done: torch.futures.Future = torch.futures.Future()
        work = QueuedWork(done.then(_outcome))
        with self._submitted:
            self._queue.append((done, result, what, call, args))
            self._pending += 1
            self._submitted.notify()
        return work

    def drain(self) -> None:
        """Wait until every submitted call has finished (on the thread itself: nothing to wait for)."""
        if self._pending and not self.is_current():
            with self._idle:
                while self._pending:
                    self._idle.wait()

    def _loop(self) -> None:
        while True:
            with self._submitted:
                while not self._queue:
                    self._submitted.wait()
                item = self._queue.popleft()
            if item is None:  # stop()
                return
            done, result, what, call, args = item
            outcome: tuple[BaseException | None, Any]
            try:
                self._run(what, call, *args)
                outcome = (None, result)
            except BaseException as err:  # raised to the caller by _outcome
                outcome = (err, None)
            done.set_result(outcome)  # completes the caller's future and runs its callbacks, here
            del item, done, result, call, args, outcome
            with self._idle:
                self._pending -= 1
                if not self._pending:
                    self._idle.notify_all()
