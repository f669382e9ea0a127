"""Running a case in forked copies of the test process, where no launcher is under test.

A fresh interpreter pays 2.5-4 s for ``import torch`` (more with scikit-learn or Lightning)
before it does anything; a copy made with ``os.fork`` has all of that imported already and
starts in milliseconds. The copy runs the real code in a process of its own, so nothing it
changes reaches the test process or the next case:

- ``fw_command``: ``fw ARGS`` as the installed command runs it (``framework.cli.main``);
- ``run_script``: ``python script.py ARGS``;

each in one process or as the ranks of one job, which find each other from the variables
torchrun gives its workers (``RANK``, ``MASTER_PORT``, ...).

What a launcher does (fw's, torchrun, mpiexec, srun, the signals sent to them) is still tested
with real processes (tests/distributed/helpers.py). A copy shows fw's warnings on its stderr,
as a fresh process does (not where pytest records the test's warnings). A test that uses these starts
processes: tests/tiers.py marks it ``procs`` (``os.fork`` below), guards.py watches the forks.
"""

from __future__ import annotations

import faulthandler
import functools
import importlib
import importlib.util
import io
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

FW = str(Path(sys.executable).parent / "fw")
#: imported by a first ``fw fit`` (the digits recipe's data, torchmetrics, the torch.compile parts
#: that an optimizer's constructor imports): seconds that every forked copy would pay again
WARM = ("torch._dynamo", "torchmetrics", "recipes.digits", "framework.loggers.tensorboard")
#: after the first rank fails, how long the others have to end before they are killed (a
#: launcher stops them; in a collective they would wait for the strategy's timeout)
GRACE_S = 10.0


def fw_command(*args: str, cwd: str | Path, env: dict[str, str], timeout: float = 60,
               nprocs: int = 1) -> subprocess.CompletedProcess:
    """``fw ARGS`` in ``cwd`` with the environment ``env``, as the installed command runs it
    (``sys.exit(framework.cli.main())``), in a forked copy of this process: its return code,
    stdout and stderr. With ``nprocs`` > 1, as the ranks of one job that torchrun started (see
    ``run_script``): the return code is the first failing rank's, the output the ranks' one after
    the other."""
    _import_what_commands_import()

    def rank(number: int) -> Callable[[], int]:
        def command() -> int:
            from framework.cli import main

            _enter(cwd, {**env, **job.rank(number)}, [FW, *args])
            return main()

        return command

    with _Job(nprocs) as job:
        done = _run_forked([rank(n) for n in range(nprocs)], timeout)
    if nprocs == 1:
        return done[0]
    return subprocess.CompletedProcess([], _job_code(done), "".join(d.stdout for d in done),
                                       "".join(d.stderr for d in done))


def run_script(script: Path, *args: str, nprocs: int = 1, timeout: float = 60, env: dict[str, str] | None = None,
               cwd: str | Path | None = None, run_id: str = "forked"):
    """``python script ARGS`` in ``cwd`` (the script's folder unless given: what a run writes where
    it stands lands beside the script, not in the repository) in ``nprocs`` forked
    copies of this process: one plain process, or the ranks of one job. These get what torchrun gives its
    workers: the variables (``RANK``, ``MASTER_PORT``, ``TORCHELASTIC_USE_AGENT_STORE``, one
    thread each; ``TORCHELASTIC_RUN_ID`` is ``run_id``: torchrun gives ``none`` without
    ``--rdzv-id``) and the agent's store, which this process hosts. Returns ``helpers.Result`` as
    ``helpers.run_script`` does, the ranks' output one after the other."""
    from distributed.helpers import Result, clean_env

    _import_what_commands_import()
    base = clean_env() if env is None else env
    cwd = Path(script).parent if cwd is None else cwd

    def rank(number: int) -> Callable[[], None]:
        def run() -> None:
            _enter(cwd, {**base, **job.rank(number)}, [str(script), *args])
            sys.path.insert(0, str(Path(script).parent))  # as `python script.py` does
            runpy.run_path(str(script), run_name="__main__")

        return run

    start = time.monotonic()
    with _Job(nprocs, run_id) as job:
        done = _run_forked([rank(n) for n in range(nprocs)], timeout)
    return Result(_job_code(done), "".join(d.stdout + d.stderr for d in done), time.monotonic() - start)


def _job_code(done: list[subprocess.CompletedProcess]) -> int:
    """A job's return code: its first failing rank's, else 0."""
    return next((d.returncode for d in done if d.returncode != 0), 0)


class _Job:
    """What torchrun gives the workers of one job of ``nprocs`` ranks (none for one process): the
    variables, and the agent's store, which this process hosts while the job runs."""

    def __init__(self, nprocs: int, run_id: str = "forked") -> None:
        self.nprocs, self.run_id = nprocs, run_id
        self.store: Any = None

    def __enter__(self) -> _Job:
        if self.nprocs > 1:
            import torch.distributed as dist

            self.store = dist.TCPStore("127.0.0.1", 0, self.nprocs, is_master=True, wait_for_workers=False)
        return self

    def __exit__(self, *exc: object) -> None:
        self.store = None  # the store's server stops with its last reference

    def rank(self, number: int) -> dict[str, str]:
        if self.store is None:
            return {}
        return {"WORLD_SIZE": str(self.nprocs), "LOCAL_WORLD_SIZE": str(self.nprocs), "GROUP_RANK": "0",
                "GROUP_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(self.store.port),
                "OMP_NUM_THREADS": "1", "TORCHELASTIC_RUN_ID": self.run_id, "TORCHELASTIC_USE_AGENT_STORE": "True",
                "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
                "RANK": str(number), "LOCAL_RANK": str(number)}


def call(fn: Callable[..., Any], *args: Any, timeout: float = 120, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` in a forked copy of this process: what it returns (pickled back),
    or the test fails with the copy's traceback. For an FSDP run in one process: its process
    groups, with Gloo's threads, live as long as the process that ran it (DTensor's caches keep
    its mesh), and a copy forked later from a process with those threads inherits the groups
    without them (tests/guards.py fails a test that leaves them)."""
    import pickle

    import pytest

    with tempfile.TemporaryDirectory(prefix="fw-call-") as out:
        returned = os.path.join(out, "returned.pkl")

        def body() -> int:
            value = fn(*args, **kwargs)
            with open(returned, "wb") as f:
                pickle.dump(value, f)
            return 0

        (done,) = _run_forked([body], timeout)
        if done.returncode != 0:
            pytest.fail(f"in a forked copy (exit {done.returncode}):\n{done.stdout}{done.stderr}", pytrace=False)
        with open(returned, "rb") as f:
            return pickle.load(f)


def in_a_copy(test: Callable[..., None]) -> Callable[..., None]:
    """The test's body runs in a forked copy (``call``); its fixtures are the test process's. The
    test is marked ``procs`` (tests/tiers.py reads the body, which starts none itself)."""
    import pytest

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        call(test, *args, **kwargs)

    return pytest.mark.procs(run)


@functools.cache
def _import_what_commands_import() -> None:
    for name in WARM:
        importlib.import_module(name)
    if importlib.util.find_spec("pytorch_lightning") is not None:  # the scripts that compare with it
        importlib.import_module("pytorch_lightning")


def _enter(cwd: str | Path, env: dict[str, str], argv: list[str]) -> None:
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    sys.argv = argv


def _run_forked(bodies: list[Callable[[], int | None]], timeout: float) -> list[subprocess.CompletedProcess]:
    """Fork one child per body; each runs it with stdout and stderr going to files of its own,
    as a fresh interpreter would (an uncaught exception prints its traceback and exits 1).
    ``timeout`` is for the reference machine (tests/timescale.py)."""
    from timescale import scaled

    timeout = scaled(timeout)
    with tempfile.TemporaryDirectory(prefix="fw-forked-") as out:
        paths = [[os.path.join(out, f"{i}.{name}") for name in ("stdout", "stderr")] for i in range(len(bodies))]
        for path in (p for pair in paths for p in pair):
            open(path, "w").close()
        statuses: dict[int, int] = {}
        pids = []
        try:
            for body, pair in zip(bodies, paths, strict=True):
                pid = os.fork()
                if pid == 0:  # the child: never returns into pytest
                    code = 1
                    try:
                        _as_a_fresh_process(pair)
                        code = _exit_code(body)
                    finally:
                        os._exit(code)
                pids.append(pid)
            _wait(pids, statuses, timeout)
        finally:  # what is still running (a timeout, or pytest-timeout interrupting) is killed
            running = [pid for pid in pids if pid not in statuses]
            for pid in running:
                os.kill(pid, signal.SIGKILL)
                statuses[pid] = os.waitpid(pid, 0)[1]
        outputs = [[Path(p).read_text() for p in pair] for pair in paths]
    codes = [os.waitstatus_to_exitcode(statuses[pid]) for pid in pids]
    if running and all(c in (0, -signal.SIGKILL) for c in codes):
        text = "".join(o + e for o, e in outputs)
        raise AssertionError(f"the forked process(es) did not finish within {timeout} s:\n{text}")
    return [subprocess.CompletedProcess([], c, o, e) for c, (o, e) in zip(codes, outputs, strict=True)]


def _as_a_fresh_process(paths: list[str]) -> None:
    """What pytest set up for the test process is not the child's: its own stdout and stderr
    (pytest captures both, the file descriptors and ``sys.stdout``/``sys.stderr``; a logging
    handler made before the fork, fw's own, writes to the new ones too), the warnings it showed
    (a fresh process shows them again) and the default signal handlers. One thread for torch: GNU OpenMP's thread pool does not survive a fork (a copy
    that runs a parallel region on more threads hangs there), and torchrun's workers have one
    each too."""
    import logging

    import torch

    torch.set_num_threads(1)

    old = {id(sys.stdout): 1, id(sys.stderr): 2, id(sys.__stdout__): 1, id(sys.__stderr__): 2}
    streams = {}
    for fd, path in zip((1, 2), paths, strict=True):
        file = os.open(path, os.O_WRONLY | os.O_APPEND)
        os.dup2(file, fd)
        os.close(file)
        streams[fd] = io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), line_buffering=True)
    sys.stdout = sys.__stdout__ = streams[1]
    sys.stderr = sys.__stderr__ = streams[2]
    import warnings

    from framework.rank_zero import _one_line_fw_warnings

    _one_line_fw_warnings()  # pytest's record of the test's warnings took fw's hook away
    warnings.onceregistry.clear()  # a warning this process showed already is shown by a fresh one
    for module in list(sys.modules.values()):
        registry = getattr(module, "__warningregistry__", None)
        if isinstance(registry, dict):
            registry.clear()
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    for handler in (h for log in loggers for h in getattr(log, "handlers", [])):
        if isinstance(handler, logging.StreamHandler) and id(handler.stream) in old:
            handler.setStream(streams[old[id(handler.stream)]])
    faulthandler.enable(file=streams[2], all_threads=True)  # a crash says where, in the copy's own stderr
    for signum in (signal.SIGTERM, signal.SIGUSR1, signal.SIGALRM):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _exit_code(body: Callable[[], int | None]) -> int:
    try:
        code = body()
    except SystemExit as stop:
        code = stop.code
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    if code is None or isinstance(code, int):
        return code or 0
    print(code, file=sys.stderr, flush=True)  # sys.exit("message"), as the interpreter does
    return 1


def _wait(pids: list[int], statuses: dict[int, int], timeout: float) -> None:
    """Collect the children's wait statuses, for ``timeout`` s at most, or ``GRACE_S`` after one
    of them failed."""
    deadline = time.monotonic() + timeout
    while len(statuses) < len(pids) and time.monotonic() < deadline:
        for pid in (p for p in pids if p not in statuses):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                statuses[pid] = status
                if os.waitstatus_to_exitcode(status) != 0:
                    deadline = min(deadline, time.monotonic() + GRACE_S)
        time.sleep(0.01)
