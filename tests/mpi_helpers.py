"""Finding mpiexec, and the skip for machines without MPI."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest


def mpiexec() -> str | None:
    """The mpiexec of this environment (next to the Python executable), else the one on PATH."""
    local = Path(sys.executable).parent / "mpiexec"
    return str(local) if local.exists() else shutil.which("mpiexec")


def skip_reason() -> str | None:
    if importlib.util.find_spec("mpi4py") is None:
        return "mpi4py is not installed (pip install 'fw[mpi]')"
    if mpiexec() is None:
        return "no mpiexec next to the Python executable or on PATH (pip install mpich)"
    return None


needs_mpi = pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")
