"""Run ``torch.distributed`` (and unmodified DDP) over MPI with the torch wheels from PyPI.

The PyPI torch wheels are built without MPI (``torch.distributed.is_mpi_available()`` is
False), so ``init_process_group("mpi")`` fails there. This module registers a Python process
group backed by mpi4py (``MPIProcessGroup`` in ``process_group.py``) as the c10d backend
``"fw_mpi"`` and initialises the default group with it: ranks come from ``MPI.COMM_WORLD``,
no address, port or rendezvous is needed.

Usage (inside a job started by ``mpiexec``/``mpirun``)::

    from framework.strategies.mpi.backend import init_mpi_process_group
    rank, world_size = init_mpi_process_group()
    model = torch.nn.parallel.DistributedDataParallel(model)   # gradients move over MPI

Install with ``pip install 'fw[mpi]'`` (mpi4py and MPICH), and launch with the ``mpiexec``
of the same environment::

    .venv/bin/mpiexec -n 2 .venv/bin/python -m mpi4py train.py

**Always launch with ``python -m mpi4py``.** MPI collectives have no timeout: when one rank
raises, the others wait in their next collective forever. Under ``-m mpi4py`` an uncaught
exception calls ``MPI_Abort`` and the launcher ends every rank within about a second, with
that rank's traceback. Without it the job hangs until something outside kills it.

Other things to know:

* CPU tensors only. DDP's gradient all-reduce overlaps backward: it runs on a communication
  thread of the group when the MPI library provides ``MPI_THREAD_MULTIPLE`` (mpi4py asks for
  it; MPICH gives it). ``MPI4PY_RC_THREAD_LEVEL=serialized`` keeps every collective
  synchronous, on the caller's thread. Other collectives are synchronous.
* ``timeout`` bounds every call of the group: past it, a watchdog aborts the MPI job (MPI's
  own collectives have no timeout); it reports a long wait on stderr every 30 s (or a third
  of the timeout), with the line of the user's code each rank is at.
* torch ranks must equal ``COMM_WORLD`` ranks (``init_mpi_process_group`` makes it so);
  ``dist.new_group(ranks, backend="fw_mpi")`` builds a sub-communicator of those ranks.
* ``reduce``/``gather``/``scatter``/``all_to_all`` work when called from Python
  (``dist.reduce``, ``dist.gather_object``, ...), but C++ code cannot reach them (c10d's
  Python trampoline has no hook for them); DDP needs only allreduce/broadcast/allgather.
* The default group's store is a process-local ``HashStore``, so ``dist.new_group(backend=
  "gloo")`` on top of it cannot rendezvous (it times out). To mix both, initialise Gloo as the
  default group (TCP rendezvous, port sent over MPI) and ``dist.new_group(backend="fw_mpi")``,
  as ``fw bench`` does under mpiexec (``_start_mpi`` in ``framework/bench/context.py``).
"""

from __future__ import annotations

import datetime
from types import ModuleType
from typing import Any

import torch.distributed as dist

from framework.errors import DistributedSetupError, install_command

BACKEND_NAME = "fw_mpi"


def _install_hint() -> str:
    return f"HINT: {install_command('mpi')} (mpi4py and mpich), then launch with that environment's mpiexec"


def _import_mpi() -> ModuleType:
    """Import ``mpi4py.MPI`` (which initialises MPI) or say how to install it."""
    try:
        from mpi4py import MPI
    except ImportError as err:
        raise DistributedSetupError(f"the mpi strategy needs mpi4py, which is not importable ({err}). {_install_hint()}") from err
    return MPI


def _create_backend(backend_opts: Any, _pg_options: Any) -> dist.ProcessGroup:
    """c10d creator (``extended_api=True``): a group over the MPI ranks of this group.

    ``backend_opts`` is c10d's private ``_DistributedBackendOptions``, whose stub lacks
    ``global_ranks_in_group``; ``_pg_options`` the backend options given to ``new_group``.
    """
    from framework.strategies.mpi.process_group import MPIProcessGroup

    MPI = _import_mpi()
    world = MPI.COMM_WORLD
    ranks = list(backend_opts.global_ranks_in_group) or list(range(world.Get_size()))
    # Create_group is collective over the members only, as c10d calls the creator only there.
    comm = world.Create_group(world.Get_group().Incl(ranks))
    if comm.Get_rank() != backend_opts.group_rank or comm.Get_size() != backend_opts.group_size:
        raise DistributedSetupError(
            f"torch rank {backend_opts.group_rank}/{backend_opts.group_size} does not match MPI rank "
            f"{comm.Get_rank()}/{comm.Get_size()}: initialise the default group with rank=COMM_WORLD.rank"
        )
    group = MPIProcessGroup(comm, getattr(backend_opts, "timeout", None))
    group.name_as(backend_opts.group_id)
    return group


def register_mpi_backend(name: str = BACKEND_NAME) -> str:
    """Register the mpi4py process group as c10d backend ``name`` (idempotent); return the name.

    Does not import mpi4py: that happens when a group is created.
    """
    if name.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(name, _create_backend, extended_api=True, devices=["cpu"])
    return name


def init_mpi_process_group(timeout: datetime.timedelta | None = None) -> tuple[int, int]:
    """Initialise the default process group over MPI; return ``(rank, world_size)``.

    Uses torch's native MPI backend when torch was built with it, else the ``fw_mpi``
    backend. Must run in every rank of a job started by ``mpiexec`` (a single process
    without it is a world of size 1).

    Args:
        timeout: passed to ``init_process_group``; the group aborts the MPI job when a call
            waits longer (torch's default, 30 minutes, when None).

    Raises:
        DistributedSetupError: mpi4py is not installed, or a group is already initialised.
    """
    if dist.is_initialized():
        raise DistributedSetupError("a torch.distributed process group is already initialised in this process")
    kwargs: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
    if dist.is_mpi_available():
        dist.init_process_group("mpi", **kwargs)
        return dist.get_rank(), dist.get_world_size()
    world = _import_mpi().COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    # The store is only a formality for c10d: all rendezvous went through MPI already.
    store = dist.HashStore()
    dist.init_process_group(register_mpi_backend(), store=store, rank=rank, world_size=size, **kwargs)
    return rank, size


def mpi_library_version() -> str | None:
    """First line of ``MPI.Get_library_version()`` (e.g. ``"MPICH Version: 5.0.2"``), or None."""
    try:
        from mpi4py import MPI
    except ImportError:
        return None
    return " ".join(MPI.Get_library_version().splitlines()[0].split()) or None
