"""Shared pieces of the multi-process tests: a free port, and running a script in 2 processes.

Every launch goes through ``subprocess.run(..., timeout=...)``: when a test's process tree hangs,
the timeout kills the launcher (its process group, so the workers go too) and the test fails
instead of hanging the suite.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

from timescale import scaled

from framework.strategies.launchers.processes import descendants as _descendants  # noqa: F401 (re-exported for the tests)
from framework.strategies.launchers.processes import kill_tree as _kill_tree

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
PYTHON = sys.executable
FW = str(Path(sys.executable).parent / "fw")

#: prepended to every generated script so that it can ``import workload`` from this folder
PREAMBLE = f"import sys\nsys.path.insert(0, {str(HERE)!r})\n"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Result:
    returncode: int
    output: str  # stdout and stderr together
    wall_s: float


def clean_env(**extra: str) -> dict[str, str]:
    """The test's environment without any launcher variables (so fw sees a plain shell)."""
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
            "MASTER_ADDR", "MASTER_PORT")
    keep = ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM")  # the user's consent, not a launcher's
    env = {k: v for k, v in os.environ.items()
           if k in keep or (k not in drop and not k.startswith(("SLURM_", "OMPI_", "PMI", "TORCHELASTIC_")))}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def write_script(tmp_path: Path, body: str, name: str = "job.py") -> Path:
    path = tmp_path / name
    path.write_text(PREAMBLE + textwrap.dedent(body))
    return path


def run_cmd(cmd: list[str], timeout: float, env: dict[str, str] | None = None, cwd: str | Path | None = None) -> Result:
    """Run ``cmd`` in ``cwd`` (the repository's root unless given, where ``conf/x.yaml`` is found: a
    command that writes where it stands gets ``trainer.default_root_dir`` under the test's
    ``tmp_path``); on timeout stop it and every process it started, then fail the test.

    The elastic agent starts its workers in sessions of their own, so killing the launcher's
    process group is not enough: the descendants are collected from ``/proc`` first. ``timeout``
    is for the reference machine (tests/timescale.py).
    """
    timeout = scaled(timeout)
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env if env is not None else clean_env(), cwd=cwd or REPO,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_tree(proc.pid)
        out, _ = proc.communicate()
        raise AssertionError(f"{' '.join(map(str, cmd))} did not finish within {timeout} s:\n{out}") from None
    except BaseException:  # interrupted (e.g. by pytest-timeout): leave nothing behind
        _kill_tree(proc.pid)
        proc.communicate()
        raise
    return Result(proc.returncode, out, time.monotonic() - start)


def run_script(script: Path, *args: str, launcher: str = "fw", nproc: int = 2, timeout: float = 60,
               env: dict[str, str] | None = None) -> Result:
    """Run ``script`` in ``nproc`` processes, in the script's folder (what a run writes where it
    stands lands beside the script, not in the repository).

    Args:
        launcher: ``"fw"``: plain ``python script.py`` (the script asks for devices=nproc and fw
            starts its own workers); ``"torchrun"``: ``python -m torch.distributed.run
            --nproc-per-node nproc --master-port PORT script.py``; ``"python"``: one plain process.
    """
    if launcher == "torchrun":
        cmd = [PYTHON, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(script), *args]
    elif launcher in ("fw", "python"):
        cmd = [PYTHON, str(script), *args]
    else:
        raise ValueError(f"unknown launcher {launcher!r}")
    return run_cmd(cmd, timeout=timeout, env=env, cwd=script.parent)


def check_ok(result: Result) -> None:
    assert result.returncode == 0, f"exit code {result.returncode}:\n{result.output}"
