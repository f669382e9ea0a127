"""The leak guards (guards.py) and the tier marks (tiers.py) find what they are for, and say it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading

import guards
import pytest
import tiers
import torch.distributed as dist


def test_a_variable_added_changed_or_removed_is_named_and_put_back(monkeypatch):
    monkeypatch.setenv("FW_GUARD_CHANGED", "before")
    monkeypatch.setenv("FW_GUARD_REMOVED", "there")
    before = guards.Snapshot()
    os.environ["FW_GUARD_ADDED"] = "1"
    os.environ["FW_GUARD_CHANGED"] = "after"
    del os.environ["FW_GUARD_REMOVED"]
    assert guards.leaks(before) == [
        "environment variable FW_GUARD_ADDED added ('1')",
        "environment variable FW_GUARD_CHANGED changed ('before' -> 'after')",
        "environment variable FW_GUARD_REMOVED removed (was 'there')",
    ]
    assert "FW_GUARD_ADDED" not in os.environ and os.environ["FW_GUARD_CHANGED"] == "before"
    assert os.environ["FW_GUARD_REMOVED"] == "there"


def test_a_signal_left_blocked_is_named_and_unblocked():
    before = guards.Snapshot()
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
    (found,) = guards.leaks(before)
    assert found == "signal mask not restored: blocked SIGUSR1, unblocked none"
    assert signal.SIGUSR1 not in signal.pthread_sigmask(signal.SIG_BLOCK, [])


def test_a_signal_handler_left_behind_is_named_and_put_back():
    before = guards.Snapshot()
    previous = signal.signal(signal.SIGUSR1, lambda *_: None)
    (found,) = guards.leaks(before)
    assert found.startswith("handler of SIGUSR1 not restored")
    assert signal.getsignal(signal.SIGUSR1) is previous


def test_a_thread_still_alive_after_the_grace_is_named(monkeypatch):
    monkeypatch.setattr(guards, "THREAD_GRACE_S", 0.05)
    release = threading.Event()
    before = guards.Snapshot()
    stuck = threading.Thread(target=release.wait, name="stuck")
    heartbeat = threading.Thread(target=release.wait, name="fw-heartbeat", daemon=True)
    quiet = threading.Thread(target=release.wait, name="someone-elses", daemon=True)
    done = threading.Thread(target=lambda: None, name="done")
    for thread in (stuck, heartbeat, quiet, done):
        thread.start()
    try:
        assert guards.leaks(before) == ["thread 'stuck' (non-daemon) still alive 0.05 s after the test",
                                        "thread 'fw-heartbeat' (daemon) still alive 0.05 s after the test"]
    finally:
        release.set()
        for thread in (stuck, heartbeat, quiet, done):
            thread.join()


def test_an_initialized_process_group_is_named_and_destroyed():
    before = guards.Snapshot()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    assert guards.leaks(before) == ["torch.distributed default process group (gloo) still initialized"]
    assert not dist.is_initialized()


class _Item:
    def __init__(self, *marks: str):
        self.marks = marks

    def get_closest_marker(self, name):
        return name if name in self.marks else None


@pytest.mark.parametrize(("marks", "argv", "found"), [
    ((), [sys.executable, "-c", "pass"],
     f"process '{sys.executable} -c pass' started, but the test is not marked procs"),
    ((), ["scontrol", "show", "hostnames", "n[1-2]"], None),  # a tool fw asks itself, in milliseconds
    (("procs",), [sys.executable, "job.py"], None),
    (("procs",), ["srun", "-n2", "python"], "process 'srun -n2 python' started, but the test is not marked cluster"),
    (("procs",), ["ip", "netns", "add", "a"], "process 'ip netns add a' started, but the test is not marked cluster"),
    (("cluster",), ["sbatch", "job.sh"], None),
])  # fmt: skip
def test_a_process_needs_the_mark_of_its_tier(marks, argv, found):
    starts = guards.Starts()
    starts.begin(_Item(*marks))
    starts.note("process", argv)
    assert starts.take() == ([found] if found else [])


def test_what_a_test_adds_to_the_repository_is_named_once_and_caches_are_not(tmp_path):
    repo = tmp_path / "repo"
    (repo / "conf").mkdir(parents=True)
    (repo / "conf" / "digits.yaml").write_text("seed: 1\n")
    (repo / "fw_logs").mkdir()  # left by an earlier run: not this test's
    tree = guards.RepoTree(repo)
    tree.begin()
    assert guards.written_into_the_repository(tree=tree) == []
    (repo / "fw_logs" / "version_0").mkdir()
    (repo / "fw_logs" / "version_0" / "metrics.csv").write_text("step\n")
    (repo / "fw_logs" / "version_0" / "hparams.yaml").write_text("{}\n")
    (repo / "conf" / "new.yaml").write_text("seed: 2\n")
    (repo / "conf" / "digits.yaml").write_text("seed: 3\n")  # changed, not added: not looked at
    for cache in ("__pycache__", ".pytest_cache"):
        (repo / cache).mkdir()
        (repo / cache / "x").write_text("")
    (found,) = guards.written_into_the_repository(workers=3, tree=tree)
    assert found.startswith(f"wrote into the repository {repo}: conf/new.yaml, fw_logs/version_0/ (2 files in it) "
                            "(a test writes into its tmp_path")
    assert "another of the 3 workers may have written it instead" in found
    assert guards.written_into_the_repository(tree=tree) == []  # named once
    (repo / "fw_logs" / "version_0" / "events").write_text("")  # inside the folder just named: still seen
    assert guards.written_into_the_repository(tree=tree) == [
        f"wrote into the repository {repo}: fw_logs/version_0/events (a test writes into its tmp_path: "
        "delete these and give the run a folder under tmp_path)"]


def test_popen_is_watched_while_this_test_runs(monkeypatch):
    monkeypatch.setattr(guards, "STARTS", guards.Starts())
    guards.STARTS.begin(_Item())
    with pytest.raises(OSError, match="fw-guard-probe"):
        subprocess.Popen(["/nonexistent/fw-guard-probe"])  # noted before it fails to start
    assert guards.STARTS.take() == ["process '/nonexistent/fw-guard-probe' started, but the test is not marked procs"]


def test_fork_is_watched_while_this_test_runs(monkeypatch):
    monkeypatch.setattr(guards, "STARTS", guards.Starts())
    guards.STARTS.begin(_Item())
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    assert guards.STARTS.take() == ["os.fork 'fork' started, but the test is not marked procs"]


def _calls_popen():
    return subprocess.run(["true"], check=True)


def _calls_a_helper():
    return _calls_popen()


def _imports_locally():
    from distributed.helpers import run_script

    return run_script


def _forks_a_copy():
    from forked import fw_command

    return fw_command("env", cwd=".", env={})


def _stays_in_process():
    return sum(range(3))


@pytest.mark.parametrize(("function", "starts"), [
    (_calls_popen, True), (_calls_a_helper, True), (_imports_locally, True), (_forks_a_copy, True),
    (_stays_in_process, False),
])  # fmt: skip
def test_a_test_is_procs_when_it_or_a_helper_it_calls_starts_a_process(function, starts):
    assert tiers._refers_to_a_starter(function) is starts


INNER = '''
import importlib, os, signal, subprocess, sys, threading, time

def test_clean():
    pass

def test_leaks_a_variable():
    os.environ["FW_INNER_LEAK"] = "1"

def test_leaks_a_handler():
    signal.signal(signal.SIGUSR2, lambda *_: None)

def test_leaks_a_thread():
    threading.Thread(target=time.sleep, args=(4,), name="inner-sleeper").start()

def test_starts_a_process_the_marks_do_not_see():
    importlib.import_module("subprocess").call([sys.executable, "-c", "pass"])  # as framework code would

def test_burns_cpu_in_a_child():  # marked procs by tiers.py, which reads the body
    subprocess.run([sys.executable, "-c", "sum(range(3 * 10**7))"], check=True)

def test_writes_into_the_repository():  # as `fw fit ... trainer.default_root_dir=.` with the checkout as cwd
    from pathlib import Path
    run = Path(__file__).resolve().parents[1] / "fw_logs" / "version_0"
    run.mkdir(parents=True)
    (run / "metrics.csv").write_text("step")
'''


def test_the_conftest_fails_each_leaking_test_and_names_the_leak(tmp_path):
    """... and lists the tests by their CPU, a child's included (cpu_report.py)."""
    from conftest import ROOT, subprocess_env

    tests = tmp_path / "tests"  # tmp_path is the repository of this run
    tests.mkdir()
    for name in ("conftest.py", "guards.py", "tiers.py", "cpu_report.py"):
        (tests / name).write_text((ROOT / "tests" / name).read_text())
    (tests / "test_inner.py").write_text(INNER)
    (tests / "pytest.ini").write_text("[pytest]\nmarkers =\n    procs\n    cluster\n")  # the tiers' marks
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_inner.py"],
                          cwd=tests, env=subprocess_env(), capture_output=True, text=True, timeout=100)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "7 passed, 5 errors" in out, out  # the calls pass, five teardowns fail
    assert f"wrote into the repository {tmp_path}: fw_logs/ (1 file in it)" in out, out
    assert "environment variable FW_INNER_LEAK added ('1')" in out
    assert "handler of SIGUSR2 not restored" in out
    assert "thread 'inner-sleeper' (non-daemon) still alive 2 s after the test" in out
    assert f"process '{sys.executable} -c pass' started, but the test is not marked procs" in out
    report = out[out.index("heaviest by CPU"):].splitlines()
    heaviest, seconds = report[1].split()[-1], float(report[1].split()[0])
    assert heaviest == "test_inner.py::test_burns_cpu_in_a_child" and seconds >= 0.3, out  # ~0.7 s of the child's
    charged, whole = map(int, re.search(r": (\d+) s in all, of (\d+) s the whole run took", report[0]).groups())
    assert whole >= charged >= round(seconds) and whole > 1, report[0]  # the run: its imports and collection too
