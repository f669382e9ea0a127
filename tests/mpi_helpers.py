"""Finding mpiexec, and the skip for machines without MPI."""

from __future__ import annotations

import importlib.util

import pytest

from framework.bench import mpiexec  # the one fw bench launches with


def skip_reason() -> str | None:
    if importlib.util.find_spec("mpi4py") is None:
        return "mpi4py is not installed (pip install 'fw[mpi]')"
    if mpiexec() is None:
        return "no mpiexec next to the Python executable or on PATH (pip install mpich)"
    return None


needs_mpi = pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")
