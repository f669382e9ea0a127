"""Fixtures and hooks for every test: the tiers (tiers.py), the leak guards (guards.py), an
isolated working directory, and the environment for child processes.

The tiers: ``pytest -m "not procs and not cluster"`` (the fast tier, one process), ``pytest``
(everything this machine can run; the cluster tests skip without SLURM or root).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

import cpu_report  # noqa: E402  (tests/ is importable from here on)
import guards  # noqa: E402
import tiers  # noqa: E402
import timescale  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    guards.watch_process_starts()
    one_torch_thread()
    python_s_own_interrupt()
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # once, before the workers start: they inherit it
        timescale.measure()
        write_bytecode()


def python_s_own_interrupt() -> None:
    """Ctrl-C handled as in a terminal: a suite started in the background by a shell without job
    control (``cmd &`` in a script) inherits SIGINT ignored, and Python then installs no handler
    of its own; the tests that check signal handlers (tests/test_stacks.py, the guard's check
    that a test restored them) expect Python's."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def one_torch_thread() -> None:
    """Torch computes on one thread in every test process, as in the processes the tests start
    (``OMP_NUM_THREADS=1``; tests/forked.py's copies). By default each of the suite's workers ran
    torch's kernels on one thread per core, all of them on the same cores: the fast tier (-n 2)
    took 67.8-72.2 s of CPU and 41-44 s against 49.8-50.1 s and 33-34 s on one thread (two runs
    each, 2 cores). The environment is left as it is, so the processes a test starts see the
    settings the test gave them."""
    import torch

    torch.set_num_threads(1)


def write_bytecode() -> None:
    """Compile fw's, the recipes' and the tests' sources into ``__pycache__`` once, before the
    workers start. Where ``PYTHONDONTWRITEBYTECODE`` is set (container images often set it), Python
    reads a cache but never writes one, so each of the suite's few hundred fresh processes compiled
    the fw modules it imports again: 0.14 s of CPU a process (importing fw's modules, median of 6:
    1.89 s uncached, 1.74 s cached). Up-to-date files are only looked at (0.5 s for all of them
    when none is)."""
    import compileall

    for folder in ("framework", "recipes", "tests"):
        compileall.compile_dir(ROOT / folder, quiet=2)


def pytest_report_header(config: pytest.Config) -> str:
    return f"time limits x{timescale.factor():.2f} for this machine (tests/timescale.py, {timescale.VARIABLE})"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tiers.mark_tiers(items)
    default_timeout = float(config.getini("timeout") or 60)
    tiers.heaviest_files_first(items, default_timeout)
    tiers.scale_timeouts(items, default_timeout, timescale.factor())


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    guards.STARTS.begin(item)  # before any fixture: a module-scoped one may start processes too
    guards.REPO.begin()
    cpu_report.start(item)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> pytest.TestReport:
    report = yield
    cpu_report.charge(item, report)
    return report


@pytest.hookimpl(trylast=True)  # after --durations' slowest
def pytest_terminal_summary(terminalreporter) -> None:
    cpu_report.summary(terminalreporter)


@pytest.fixture(autouse=True)
def leak_guard(request):
    """Fails a test that leaves a thread, a signal handler, an environment variable or a process
    group behind, starts processes without its mark, or writes into the repository (see guards.py)."""
    before = guards.Snapshot()
    yield
    found = [*guards.leaks(before), *guards.STARTS.take(), *guards.written_into_the_repository(workers(request.config))]
    if found:
        pytest.fail("leak guard (tests/guards.py):\n  " + "\n  ".join(found), pytrace=False)


def workers(config: pytest.Config) -> int:
    """How many pytest-xdist workers run tests at the same time (1 without ``-n``)."""
    worker = getattr(config, "workerinput", None)
    return int(worker["workercount"]) if worker else 1


@pytest.fixture(autouse=True)
def _isolated_cwd(leak_guard, tmp_path, monkeypatch):
    """Runs write under a temporary directory, and the global seed does not leak. (``leak_guard``
    comes first, so that it looks after ``monkeypatch`` has put everything back.)"""
    monkeypatch.chdir(tmp_path)
    import framework.seed

    monkeypatch.setattr(framework.seed, "_seed", None)
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)


def subprocess_env() -> dict:
    """Environment for child processes: the repo and tests/ importable."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests"), env.get("PYTHONPATH", "")])
    return env


@pytest.fixture
def mount(tmp_path):
    """``mount(options) -> path``: a fresh tmpfs (a full disk, a read-only one); unmounted afterwards.
    Mounting needs root: the test skips with the reason otherwise."""
    mounted = []

    def make(options: str) -> Path:
        path = tmp_path / f"mnt{len(mounted)}"
        path.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or 'not root'})")
        mounted.append(path)
        return path

    yield make
    for path in mounted:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)
