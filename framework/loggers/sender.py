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
is left is dropped, and one warning counts everything that was not sent (``dropped``).
"""

from __future__ import annotations

import collections
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
    """

    def __init__(self, who: str, where: str, max_pending: int = 10_000, retry_every: float = 2.0,
                 stall_after: float = 10.0) -> None:
        self.who, self.where = who, where
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

    def close(self, wait: float, answers: Callable[[], bool]) -> None:
        """Send what is left, then end the thread. Waits while calls get sent; once ``wait``
        seconds have passed, gives up as soon as a call failed for want of the server or
        ``answers()`` (a quick look: does the server take a connection?) says it is away,
        dropping what is left. Then one warning counts everything that was not sent."""
        start = time.monotonic()
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        while self._thread.is_alive():
            self._thread.join(timeout=1.0)
            if self._thread.is_alive() and time.monotonic() - start >= wait and (self.server_away or not answers()):
                self._abandon()
                break
        if self.dropped:
            counts = ", ".join(f"{n} {what}" for what, n in self.dropped.items())
            rank_zero_warn(f"{self.who}: not sent to {self.where}: {counts}")

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
            except Exception as err:  # noqa: BLE001 (a logger's failure must not end training)
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


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    line = text.splitlines()[0] if text else type(err).__name__
    return line if len(line) <= 300 else line[:297] + "..."
