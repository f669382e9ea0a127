"""Running a case in a forked copy of the test process, where no launcher is under test.

A fresh interpreter pays 2.5-4 s for ``import torch`` (and more for scikit-learn or Lightning)
before it does anything; a copy made with ``os.fork`` has all of that imported already and
starts in milliseconds. The copy runs the real code (``framework.cli.main`` with the command's
arguments, a Trainer on 2 Gloo ranks that find each other as torchrun's workers do) in a process
of its own, so nothing it changes reaches the test process or the next case. What a launcher does
(fw's, torchrun, mpiexec, srun, signals to them) is still tested with real processes
(tests/distributed/helpers.py).

A test that uses these starts processes: tests/tiers.py marks it ``procs`` (``os.fork`` below).
"""

from __future__ import annotations

import functools
import importlib
import io
import os
import pickle
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


def fw_command(*args: str, cwd: str | Path, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    """``fw ARGS`` in ``cwd`` with the environment ``env``, as the installed command runs it
    (``sys.exit(framework.cli.main())``), in a forked copy of this process: the return code,
    stdout and stderr of that process."""

    _import_what_commands_import()

    def command() -> int:
        from framework.cli import main

        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        sys.argv = [FW, *args]
        return main()

    return _run_forked(command, timeout)


#: imported by a first ``fw fit`` (the digits recipe's data, torchmetrics, the torch.compile parts
#: that an optimizer's constructor imports): seconds that every forked command would pay again
WARM = ("torch._dynamo", "torchmetrics", "sklearn.datasets", "recipes.digits", "framework.loggers.tensorboard")


@functools.cache
def _import_what_commands_import() -> None:
    for name in WARM:
        importlib.import_module(name)


def call(fn: Callable[..., Any], *args: Any, timeout: float = 60) -> Any:
    """``fn(*args)`` in a forked copy of this process; its return value (pickled back), or an
    AssertionError with its traceback and output."""
    with tempfile.TemporaryDirectory(prefix="fw-forked-") as out:
        result = Path(out) / "result.pkl"

        def run() -> int:
            value = fn(*args)
            result.write_bytes(pickle.dumps(value))
            return 0

        done = _run_forked(run, timeout)
        if done.returncode != 0:
            raise AssertionError(f"{fn.__name__} failed in the forked process (exit {done.returncode}):\n"
                                 f"{done.stdout}{done.stderr}")
        return pickle.loads(result.read_bytes())


def _run_forked(body: Callable[[], int | None], timeout: float) -> subprocess.CompletedProcess:
    """Fork; the child runs ``body`` with stdout and stderr going to files of its own, as a
    fresh interpreter would (an uncaught exception prints its traceback and exits 1)."""
    with tempfile.TemporaryDirectory(prefix="fw-forked-") as out:
        paths = [os.path.join(out, "stdout"), os.path.join(out, "stderr")]
        for path in paths:
            open(path, "w").close()
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            code = 1
            try:
                _as_a_fresh_process(paths)
                code = _exit_code(body)
            finally:
                os._exit(code)
        status = _wait(pid, timeout)
        stdout, stderr = (Path(p).read_text() for p in paths)
    if status is None:
        raise AssertionError(f"the forked process did not finish within {timeout} s:\n{stdout}{stderr}")
    return subprocess.CompletedProcess([], os.waitstatus_to_exitcode(status), stdout, stderr)


def _as_a_fresh_process(paths: list[str]) -> None:
    """What pytest set up for the test process is not the child's: its own stdout and stderr
    (pytest captures both, the file descriptors and ``sys.stdout``/``sys.stderr``; a logging
    handler made before the fork, fw's own, writes to the new ones too) and the default signal
    handlers. Warnings are still recorded where pytest records them: a test of what a warning
    looks like on stderr runs a real process."""
    import logging

    old = {id(sys.stdout): 1, id(sys.stderr): 2, id(sys.__stdout__): 1, id(sys.__stderr__): 2}
    streams = {}
    for fd, path in zip((1, 2), paths, strict=True):
        file = os.open(path, os.O_WRONLY | os.O_APPEND)
        os.dup2(file, fd)
        os.close(file)
        streams[fd] = io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), line_buffering=True)
    sys.stdout = sys.__stdout__ = streams[1]
    sys.stderr = sys.__stderr__ = streams[2]
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    for handler in (h for log in loggers for h in getattr(log, "handlers", [])):
        if isinstance(handler, logging.StreamHandler) and id(handler.stream) in old:
            handler.setStream(streams[old[id(handler.stream)]])
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


def _wait(pid: int, timeout: float) -> int | None:
    """The child's wait status; None (and the child killed) after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None
