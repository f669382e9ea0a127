"""The launcher's process helpers, on real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from framework.strategies.processes import descendants, kill_tree, resume_stopped_on_sigterm

# a worker's stand-in: a SIGTERM handler (as fw's trainer has), so a stopped one cannot act on it
WORKER = "import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(3))\nprint('ready', flush=True)\ntime.sleep(60)\n"


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


@pytest.mark.timeout(30)
def test_a_stopped_worker_is_resumed_only_once_a_sigterm_waits_for_it():
    child = subprocess.Popen([sys.executable, "-c", WORKER], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        assert child.pid in descendants(os.getpid())
        os.kill(child.pid, signal.SIGSTOP)
        with resume_stopped_on_sigterm(every=0.05):
            time.sleep(0.5)
            assert _state(child.pid) == "T"  # stopped by someone, nothing to act on: left alone
            os.kill(child.pid, signal.SIGTERM)
            assert child.wait(timeout=10) == 3  # resumed, and its handler ran
    finally:
        kill_tree(child.pid)
        child.wait()


@pytest.mark.timeout(30)
def test_without_the_watcher_a_stopped_worker_sits_on_its_sigterm():
    child = subprocess.Popen([sys.executable, "-c", WORKER], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        os.kill(child.pid, signal.SIGSTOP)
        os.kill(child.pid, signal.SIGTERM)
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(timeout=1)
    finally:
        kill_tree(child.pid)
        child.wait()
