"""A logger's calls to its server, sent in order from one background thread, so that a server
that goes away never stops training.

The training loop only puts a call in the queue (``put``) and goes on. The thread runs the calls
one after the other, in the order they came. A call that fails because the server does not answer
(no connection, a time-out, too many 5xx answers: ``is_transient``) stays at the head of the
queue and is tried again every ``retry_every`` seconds, so the logger catches up, in order,
when the server is back. One warning says when the server went away (naming the logger, the URL
and what waits): when a call failed so, or when one has waited ``stall_after`` seconds (a
client's own retries, MLflow's about 4 minutes, hold it that long); one info line when it is back. A call the server refuses for good (a 4xx
answer: a bad value) is dropped; the first one with a warning naming it, the others counted.

The queue is bounded (``max_pending`` calls): what comes while it is full is dropped and
counted. At the end (``close``) the thread gets time to send what is left: as long as it makes
progress, or at least ``wait`` seconds; after that, when the server still does not answer, what
is left is dropped, and one warning counts everything that was not sent (``dropped``). A call
that has been in flight for ``wait`` seconds by then (a server that answers only 5xx, which the
client retries for minutes, or one that takes the connection and never answers) is given up too.

A sender belongs to the process that made it (``pid``): a forked child (``ddp_notebook``) has
a copy of it but not its thread, so the logger makes a new one there (``mine``). A sender never
closed (no ``finalize``) is closed when the interpreter exits (``atexit``), with the same wait
and the same count.
"""

from __future__ import annotations

import atexit
import collections
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from framework.rank_zero import rank_zero_info, rank_zero_warn


@dataclass
class Call:
    """One call to the server: ``send()`` does it; ``what`` names what it carries, counted
    ``count`` times (``"metric values"``, 12) when it is not sent; ``done`` runs after it
    was sent or dropped (removes a staged file)."""

    send: Callable[[], object]
    what: str
    count: int = 1
    done: Callable[[], None] | None = None


def is_transient(err: BaseException) -> bool:
    """The server did not answer (or answered 5xx until the client gave up): worth trying
    again later. Anything else (a 4xx answer, a bad value) will fail again the same way."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, (ConnectionError, TimeoutError)):  # the builtins (also what urllib raises)
            return True
        module = type(err).__module__
        if module.startswith(("requests", "urllib3")):  # ConnectionError, Timeout, RetryError (too many 5xx)
            return True
        err = err.__cause__ or err.__context__  # type: ignore[assignment]
    return False


class Sender:
    """The background sender of one logger (``who``) for the server at ``where``.

    Args:
        who: The logger, as the warnings name it (``"MLFlowLogger"``).
        where: The server's URL, as the warnings name it.
        max_pending: The most calls kept while the server does not answer.
        retry_every: Seconds between two tries of a call that failed for want of the server.
        stall_after: Seconds a call may wait for the server before the warning.
        wait: ``close``'s wait when none is given (at exit).
        answers: ``close``'s quick look at the server when none is given (at exit).
    """

    def __init__(self, who: str, where: str, max_pending: int = 10_000, retry_every: float = 2.0,
                 stall_after: float = 10.0, wait: float = 30.0, answers: Callable[[], bool] | None = None) -> None:
        self.who, self.where, self.wait, self.answers = who, where, wait, answers or (lambda: True)
        self.pid = os.getpid()
        self.max_pending, self.retry_every, self.stall_after = max_pending, retry_every, stall_after
        self.dropped: collections.Counter[str] = collections.Counter()  # what -> how many, not sent
        self._queue: collections.deque[Call] = collections.deque()
        self._cond = threading.Condition()
        self._closing = self._abandoned = False
        self._down_since: float | None = None  # monotonic time of the first failure of this outage
        self._last_progress = time.monotonic()
        self._said_full = self._said_refused = False
        self._said_away = False  # the warning of this outage was given
        self._sending_since: float | None = None  # monotonic time the call in flight began
        self._thread = threading.Thread(target=self._run, name=f"fw-{who}-sender", daemon=True)
        self._thread.start()
        with _LIVE_LOCK:
            _LIVE.add(self)
        _close_at_exit_once()

    @property
    def mine(self) -> bool:
        """Made in this process (a forked child's copy has no thread: it must not be used there)."""
        return self.pid == os.getpid()

    @property
    def server_away(self) -> bool:
        """The last try failed for want of the server (and nothing was sent since)."""
        return self._down_since is not None

    def put(self, call: Call) -> None:
        """Queue ``call``; never waits for the server."""
        since = self._sending_since
        if since is not None and not self._said_away and time.monotonic() - since >= self.stall_after:
            self._say_away(f"a call has waited {time.monotonic() - since:.0f} s for an answer")
        with self._cond:
            if len(self._queue) >= self.max_pending:
                self._drop(call)
                if not self._said_full:
                    self._said_full = True
                    rank_zero_warn(f"{self.who}: {self.max_pending} calls wait for {self.where} already; what is "
                                   "logged from now on is dropped (and counted) until it is back")
                return
            self._queue.append(call)
            self._cond.notify_all()

    def close(self, wait: float | None = None, answers: Callable[[], bool] | None = None) -> None:
        """Send what is left, then end the thread. Waits while calls get sent; once ``wait``
        seconds have passed, gives up as soon as a call failed for want of the server, the call
        in flight has been sent for ``wait`` seconds, or ``answers()`` (a quick look: does the
        server take a connection?) says it is away, dropping what is left. What is still queued
        when the thread has ended is dropped too. Then one warning counts everything that was
        not sent. (Call it in the process that made the sender: ``mine``.)"""
        wait = self.wait if wait is None else wait
        answers = self.answers if answers is None else answers
        with _LIVE_LOCK:
            _LIVE.discard(self)
        start = time.monotonic()
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        while self._thread.is_alive():
            self._thread.join(timeout=1.0)
            if self._thread.is_alive() and time.monotonic() - start >= wait and (
                    self.server_away or self._stuck(wait) or not answers()):
                break
        self._abandon()  # whatever is still queued (nothing, when the thread sent it all)
        if self.dropped:
            counts = ", ".join(f"{n} {what}" for what, n in self.dropped.items())
            rank_zero_warn(f"{self.who}: not sent to {self.where}: {counts}")

    def _stuck(self, wait: float) -> bool:
        since = self._sending_since
        return since is not None and time.monotonic() - since >= wait

    # -- the thread -----------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing and not self._abandoned:
                    self._cond.wait()
                if self._abandoned or not self._queue:
                    return
                call = self._queue[0]
            self._sending_since = time.monotonic()
            try:
                call.send()
            except Exception as err:  # a logger's failure must not end training
                self._sending_since = None
                if self._abandoned:
                    return
                if is_transient(err):
                    self._went_away(err)
                    with self._cond:
                        self._cond.wait_for(lambda: self._abandoned, timeout=self.retry_every)
                    continue
                if not self._said_refused:  # a server that refuses every call: one warning, and the count at the end
                    self._said_refused = True
                    rank_zero_warn(f"{self.who}: {self.where} refused {call.what} ({_first_line(err)}); dropped, as is "
                                   "whatever it refuses from now on (counted at the end)")
                self._finish(call, sent=False)
                continue
            self._sending_since = None
            self._came_back()
            self._finish(call, sent=True)

    def _finish(self, call: Call, sent: bool) -> None:
        with self._cond:
            if self._queue and self._queue[0] is call:
                self._queue.popleft()
            if not sent:
                self._drop(call)
            self._last_progress = time.monotonic()
        if call.done is not None:
            call.done()

    def _went_away(self, err: BaseException) -> None:
        if self._down_since is None:
            self._down_since = time.monotonic()
        if not self._said_away:
            self._say_away(_first_line(err))

    def _say_away(self, why: str) -> None:
        self._said_away = True
        rank_zero_warn(f"{self.who}: {self.where} does not answer ({why}); training goes on, and the metrics, "
                       f"parameters and checkpoints logged meanwhile wait (up to {self.max_pending} calls) to be "
                       "sent when it is back")

    def _came_back(self) -> None:
        if self._said_away:
            self._said_away = False
            rank_zero_info(f"{self.who}: {self.where} answers again; sending what waited ({len(self._queue)} calls)")
        self._down_since = None

    def _abandon(self) -> None:
        with self._cond:
            self._abandoned = True
            left = list(self._queue)
            self._queue.clear()
            for call in left:
                self._drop(call)
            self._cond.notify_all()
        for call in left:
            if call.done is not None:
                call.done()

    def _drop(self, call: Call) -> None:
        self.dropped[call.what] += call.count


_LIVE: set[Sender] = set()  # the senders not closed yet
_LIVE_LOCK = threading.Lock()
_AT_EXIT: list[bool] = []


def _close_at_exit_once() -> None:
    if not _AT_EXIT:
        _AT_EXIT.append(True)
        atexit.register(_close_at_exit)


def _forget_in_child() -> None:
    """A forked child: the parent's senders are not its own (their threads are not here), and a
    lock some thread of the parent held at the fork would stay held for good."""
    global _LIVE_LOCK
    _LIVE_LOCK = threading.Lock()
    _LIVE.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def _close_at_exit() -> None:
    """The senders of this process that no ``finalize`` closed: what they hold goes now (or is
    counted), instead of dying with their daemon thread."""
    with _LIVE_LOCK:
        left = [sender for sender in _LIVE if sender.mine]
    for sender in left:
        sender.close()


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    line = text.splitlines()[0] if text else type(err).__name__
    return line if len(line) <= 300 else line[:297] + "..."
