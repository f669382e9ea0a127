"""The launcher's process helpers, on real processes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest

from framework.strategies.launchers.processes import children, descendants, kill_tree, resume_stopped_workers

# a worker's stand-in: handlers for the signals that end a job, unblocked (as fw's fit has them: a
# worker that fw's launcher starts has them blocked until then, and a child inherits its parent's
# mask), so a stopped one cannot act on them until it runs again
WORKER = """
import signal, sys, time
for s in (signal.SIGTERM, signal.SIGUSR1):
    signal.signal(s, lambda signum, frame: sys.exit(signum))
signal.pthread_sigmask(signal.SIG_UNBLOCK, (signal.SIGTERM, signal.SIGUSR1))
print('ready', flush=True)
time.sleep(60)
"""


def _state(pid: int) -> str:
    """The process's state letter (R, S, T, Z...), or "" once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return ""


@pytest.mark.timeout(30)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_a_stopped_worker_is_resumed_only_once_a_signal_to_end_it_waits(sig):
    child = subprocess.Popen([sys.executable, "-c", WORKER], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        os.kill(child.pid, signal.SIGSTOP)
        with resume_stopped_workers([signal.SIGTERM, signal.SIGUSR1], every=0.05):
            time.sleep(0.5)
            assert _state(child.pid) == "T"  # stopped on purpose, nothing to act on: left alone
            os.kill(child.pid, sig)
            assert child.wait(timeout=10) == sig  # resumed, and its handler ran
    finally:
        kill_tree(child.pid)
        child.wait()


@pytest.mark.timeout(30)
def test_kill_tree_ends_a_tree_whose_grandchild_left_the_session():
    # the elastic agent's workers: a session of their own, so a process-group kill misses them
    grandchild = "import os, time; os.setsid(); print(os.getpid(), flush=True); time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys, time\n"
                              f"subprocess.Popen([sys.executable, '-c', {grandchild!r}]); time.sleep(60)"],
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    grand = int(child.stdout.readline())
    try:
        assert descendants(child.pid) == [grand]
        kill_tree(child.pid)
        assert child.wait(timeout=10) == -signal.SIGKILL
        deadline = time.monotonic() + 10
        while _state(grand) not in ("", "Z") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _state(grand) in ("", "Z")  # gone, or dead and waiting for init to reap it
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(grand, signal.SIGKILL)
        kill_tree(child.pid)
        child.wait()


def test_children_are_the_direct_ones_only():
    child = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time\n"
                              "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
                              "print('ready', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert child.stdout.readline() == "ready\n"
        (grandchild,) = children(child.pid)
        mine = children(os.getpid())
        assert child.pid in mine and grandchild not in mine and grandchild in descendants(os.getpid())
    finally:
        kill_tree(child.pid)
        child.wait()
