"""The processes a launcher started: find them all (``descendants``), end them all
(``kill_tree``), and let a stopped worker act on the SIGTERM that ends a job
(``resume_stopped_on_sigterm``).

torch's elastic agent starts its workers in sessions of their own, out of reach of a
process-group signal, so the tree is read from ``/proc``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from pathlib import Path
from typing import Iterator

def descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (children, theirs, ...), read from ``/proc``."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and all its descendants."""
    for p in [pid, *descendants(pid)]:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def stopped_with_sigterm_pending(pid: int) -> bool:
    """Is ``pid`` stopped (SIGSTOP, SIGTSTP, SIGTTOU...) with a SIGTERM it cannot act on until
    it runs again?"""
    try:
        status = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                      if ":\t" in line)  # fmt: skip
    except OSError:
        return False
    pending = int(status.get("SigPnd", "0"), 16) | int(status.get("ShdPnd", "0"), 16)
    return status.get("State", "").startswith("T") and bool(pending & (1 << (signal.SIGTERM - 1)))


@contextlib.contextmanager
def resume_stopped_on_sigterm(every: float = 0.5) -> Iterator[None]:
    """While the block runs, a worker below this process that is stopped with a SIGTERM pending
    gets SIGCONT, so that it acts on the SIGTERM now (as systemd follows its SIGTERM with SIGCONT).

    Without it, a worker stopped by SIGSTOP when the elastic agent ends the job sits out the
    agent's 30 s wait before its SIGKILL. A stopped worker with no SIGTERM pending (a debugger's,
    a user's Ctrl-Z) is left alone.
    """
    from framework.rank_zero import library_logger

    done, me, log = threading.Event(), os.getpid(), library_logger()

    def watch() -> None:
        resumed: set[int] = set()
        while not done.wait(every):
            for pid in descendants(me):
                if pid not in resumed and stopped_with_sigterm_pending(pid):
                    resumed.add(pid)
                    log.warning("fw: worker pid %d was stopped when the job ended: resumed it (SIGCONT) "
                                "so that it acts on its SIGTERM", pid)
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGCONT)

    thread = threading.Thread(target=watch, name="fw-resume-stopped", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
