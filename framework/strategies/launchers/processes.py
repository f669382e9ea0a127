"""The processes a launcher started: find them all (``descendants``), end them all
(``kill_tree``), and let a stopped worker act on the signal that ends its job
(``resume_stopped_workers``), start them with the preemption signal blocked (``started_blocking``),
with a thread beside the block (``beside``); in a worker, tell whether its launcher died
(``launcher_lost``); in the launcher, wait at the job's end for the other nodes' agents no longer
than the strategy's timeout (``exit_barrier_within``).

torch's elastic agent starts its workers in sessions of their own, out of reach of a
process-group signal, so the tree is read from ``/proc``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any


def _process_table() -> dict[int, list[int]]:
    """Every process's children, by parent pid, read from ``/proc/*/stat``."""
    table: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        table.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    return table


def descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (children, theirs, ...), read from ``/proc``."""
    table = _process_table()
    found, todo = [], [pid]
    while todo:
        for child in table.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def children(pid: int) -> list[int]:
    """The processes ``pid`` started: from ``/proc/PID/task/*/children`` where the kernel has
    it (a few reads), else from the whole process table."""
    listed = list(Path(f"/proc/{pid}/task").glob("*/children"))
    if not listed:
        return _process_table().get(pid, [])
    found = []
    for path in listed:
        with contextlib.suppress(OSError):
            found += [int(p) for p in path.read_text().split()]
    return found


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and all its descendants. They are stopped first, until a look at the tree
    finds no new one: a stopped process cannot start another, and a child started between the
    look and the kill would otherwise outlive its killed parent."""
    frozen: list[int] = []
    while True:
        new = [p for p in [pid, *descendants(pid)] if p not in frozen]
        if not new:
            break
        for p in new:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGSTOP)
        frozen += new
    for p in frozen:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)


def stopped_with_pending(pid: int, signals: Iterable[int]) -> int | None:
    """The first of ``signals`` that ``pid`` has pending while it is stopped (SIGSTOP, SIGTSTP,
    SIGTTOU: state T; a debugger's stop is t, not T), else None. A stopped process cannot act on
    a signal it handles until it runs again."""
    try:
        status = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                      if ":\t" in line)  # fmt: skip
    except OSError:
        return None
    if not status.get("State", "").startswith("T"):
        return None
    pending = int(status.get("SigPnd", "0"), 16) | int(status.get("ShdPnd", "0"), 16)
    return next((s for s in signals if pending & (1 << (s - 1))), None)


@contextlib.contextmanager
def resume_stopped_workers(signals: Iterable[int], every: float = 1.0) -> Iterator[None]:
    """While the block runs, a process below this one that is stopped with one of ``signals``
    pending (the elastic agent's SIGTERM that ends the job, or a signal it passes on) gets
    SIGCONT, so that it acts on that signal now, as systemd follows its SIGTERM with SIGCONT.

    Without it, a worker stopped by SIGSTOP sits out the agent's 30 s wait for its SIGKILL. A
    stopped worker with nothing pending (someone stopped it on purpose) is left alone.
    """
    from framework.rank_zero import library_logger

    done, me, log, signals = threading.Event(), os.getpid(), library_logger(), tuple(signals)

    def watch() -> None:
        resumed: set[int] = set()
        while not done.wait(every):
            for pid in children(me):  # the elastic agent's workers are this process's children
                sig = None if pid in resumed else stopped_with_pending(pid, signals)
                if sig is not None:
                    resumed.add(pid)
                    log.warning("fw: worker pid %d is stopped with %s pending: resumed it (SIGCONT) so that it "
                                "acts on it", pid, signal.Signals(sig).name)
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGCONT)

    with beside(watch, "fw-resume-stopped", done):
        yield


#: tells a worker the pid of the fw launcher that started it (``launchers.as_launcher_worker``)
LAUNCHER_PID = "FW_LAUNCHER_PID"
#: tells a worker which signals its launcher blocked for it (``started_blocking``): a fit unblocks
#: them for good once it can handle them (``trainer/preemption.py``)
BLOCKED_AT_START = "FW_BLOCKED_AT_START"


@contextlib.contextmanager
def started_blocking(signals: Iterable[int]) -> Iterator[None]:
    """Processes started in the block start with ``signals`` blocked: one that arrives before
    the worker's fit can handle it (SLURM may signal a minute early, while it imports torch or
    reads its data) waits for the fit instead of killing the worker. A child inherits the mask
    of the thread that forks it; this process still receives them on a thread of its own, with
    them unblocked (Python runs the handlers in its main thread all the same)."""
    signals = tuple(signals)
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    done = threading.Event()
    os.environ[BLOCKED_AT_START] = ",".join(signal.Signals(s).name for s in signals)

    def receive() -> None:  # started before the mask below: the thread that receives them
        done.wait()

    with beside(receive, "fw-signals", done):
        before = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, before)
            os.environ.pop(BLOCKED_AT_START, None)


@contextlib.contextmanager
def beside(target: Callable[[], None], name: str, done: threading.Event) -> Iterator[None]:
    """Run ``target`` on a daemon thread while the block runs; at its end set ``done`` (which
    ``target`` waits on) and join the thread."""
    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def launcher_lost(within: float = 0.2) -> bool:
    """In a worker of fw's launcher, on a SIGTERM: has the launcher died (the kernel then sends
    it)? The kernel sends it when the launcher's thread that started the worker dies, which may
    be before the rest of the launcher: so watch it for ``within`` seconds."""
    launcher = os.environ.get(LAUNCHER_PID)
    if not launcher:
        return False
    end = time.monotonic() + within
    while True:
        try:
            with open(f"/proc/{launcher}/stat") as stat:
                state = stat.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            state = "gone"
        if str(os.getppid()) != launcher or state in ("gone", "Z", "X"):
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(0.01)


@contextlib.contextmanager
def exit_barrier_within(seconds: float) -> Iterator[None]:
    """torch's agent waits up to 300 s at the end of the job for the other nodes' agents (its exit
    barrier); a node whose launcher died never comes. Wait no longer than the strategy's timeout,
    and say why when it runs out."""
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent

    original = SimpleElasticAgent._exit_barrier

    def bounded(agent: Any) -> None:
        agent._exit_barrier_timeout = min(agent._exit_barrier_timeout, seconds)
        start = time.monotonic()
        original(agent)
        group = agent._worker_group
        if group.group_world_size > 1 and time.monotonic() - start >= 0.9 * agent._exit_barrier_timeout:
            sys.stderr.write(f"fw: launcher of node {group.group_rank}: a node's launcher did not reach the end of "
                             f"the job within {seconds:g} s (trainer.strategy.timeout): it was lost; this node's "
                             "workers ended as said above\n")

    SimpleElasticAgent._exit_barrier = bounded  # type: ignore[method-assign]
    try:
        yield
    finally:
        SimpleElasticAgent._exit_barrier = original  # type: ignore[method-assign]
