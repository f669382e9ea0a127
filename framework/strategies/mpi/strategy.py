"""DDP whose communication runs over MPI, for jobs started with ``mpirun``/``mpiexec``.

PyTorch wheels carry no native MPI backend. When torch has one, ``init_process_group("mpi")``
is used; otherwise ``framework.strategies.mpi.backend`` registers a ProcessGroup backed by mpi4py
(backend ``fw_mpi``), so unmodified DDP (bucketing, ``no_sync``, its options) and every
collective of the framework move data over MPI, with no ports to open. Where the MPI library
allows calls from several threads, DDP's gradient all-reduce overlaps backward (see
``process_group.py``).

Ranks come from the MPI launcher. Without one, ``fw fit`` with ``devices > 1`` refuses with the
command to run (MPI jobs are started by ``mpiexec``, not by fw). An exception on one rank aborts
the whole job through ``MPI.COMM_WORLD.Abort`` so that no rank waits forever in a collective
(MPI collectives have no timeout); a rank that stops answering makes the others abort the job
once they have waited ``timeout`` seconds in one call (the ``fw_mpi`` group's watchdog).
"""

from __future__ import annotations

import datetime
import sys
import time
import traceback
from collections.abc import Callable
from types import TracebackType
from typing import Any

import torch

from framework.environments import ClusterEnvironment
from framework.errors import ConfigError, DistributedSetupError
from framework.strategies.distributed import DEFAULT_TIMEOUT_S, DistributedStrategy
from framework.strategies.launchers import Launcher, MPIExecLauncher


class MPIStrategy(DistributedStrategy):
    """DDP whose default process group runs over MPI; ranks come from ``mpiexec``.

    Args:
        timeout: seconds one collective may wait for the other ranks before the MPI job is
            aborted (the ``fw_mpi`` group's watchdog; MPI's own collectives have no timeout).
        find_unused_parameters, bucket_cap_mb, static_graph, gradient_as_bucket_view: passed
            to ``DistributedDataParallel``.
        init_method: refused: MPI connects the ranks itself (there is no address or file to
            meet at), so an init method would be silently ignored.
    """

    name = "mpi"

    def __init__(
        self,
        timeout: float = DEFAULT_TIMEOUT_S,
        find_unused_parameters: bool = False,
        bucket_cap_mb: float | None = None,
        static_graph: bool = False,
        gradient_as_bucket_view: bool = False,
        init_method: str | None = None,
    ) -> None:
        if init_method is not None:
            raise ConfigError(
                f"trainer.strategy.init_method={init_method!r}: the mpi strategy connects its ranks "
                "through MPI (started by mpiexec), not through an init method; remove init_method, "
                "or use strategy ddp_gloo for env://, tcp:// or file://"
            )
        super().__init__(timeout, find_unused_parameters, bucket_cap_mb, static_graph, gradient_as_bucket_view)
        self.backend = "mpi"  # until the group exists: then fw_mpi, or mpi when torch has it

    def launcher(self, environment: ClusterEnvironment, num_nodes: int, max_restarts: int,
                 rdzv_endpoint: str | None) -> Launcher | None:
        if not self._needs_launcher(environment, num_nodes):
            return None
        return MPIExecLauncher(len(self.devices) * num_nodes)

    def _init_process_group(self) -> None:
        from framework.strategies.mpi.backend import init_mpi_process_group

        rank, world_size = init_mpi_process_group(datetime.timedelta(seconds=self.timeout))
        if (rank, world_size) != (self.dist.rank, self.dist.world_size):
            raise DistributedSetupError(
                f"MPI reports rank {rank} of {world_size} but the launcher's variables say "
                f"{self.dist.rank} of {self.dist.world_size}; run fw under one mpiexec"
            )

    def setup_environment(self) -> None:
        super().setup_environment()
        self.backend = torch.distributed.get_backend()  # fw_mpi, or mpi when torch has it
        if self.world_size > 1:
            _abort_on_uncaught_errors()  # for the MPI job's life, not only this run (see there)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "init_method": "mpi"}

    def on_exception(self, exc: BaseException) -> None:
        """Report this rank's error, then abort every rank of the MPI job."""
        if self.world_size > 1:
            abort_mpi_job(exc)


def abort_mpi_job(exc: BaseException) -> None:
    """Print ``exc`` (one line for a user mistake, else the traceback) and abort all ranks:
    MPI collectives have no timeout, so the others would otherwise wait forever."""
    from framework.errors import FwError

    # the real stderr: torch's excepthook swaps sys.stderr for a buffer while ours runs, and the
    # abort would lose the buffer (a process started without one has only sys.stderr)
    stream = sys.__stderr__ or sys.stderr
    if isinstance(exc, FwError):
        stream.write(f"fw: error: {exc}\n")
    else:
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=stream)
    from mpi4py import MPI

    rank = MPI.COMM_WORLD.Get_rank()
    stream.write(f"fw: rank {rank} failed; aborting the MPI job\n")
    stream.flush()
    time.sleep(0.5)  # let the launcher forward this rank's output before the abort tears it down
    MPI.COMM_WORLD.Abort(getattr(exc, "exit_code", 1))


def _abort_on_uncaught_errors() -> None:
    """An error outside the Trainer's run (code between fit and test) must end the MPI job too:
    chain an excepthook that aborts it. It belongs to the MPI job, not to a Trainer: installed
    when fw initialises MPI's process group (not when a Trainer is built), and it steps aside
    (calls the previous hook) once MPI is finalised or for one-rank jobs."""
    previous = sys.excepthook
    if getattr(previous, "_fw_mpi_abort", False):
        return
    sys.excepthook = _AbortingExcepthook(previous)


class _AbortingExcepthook:
    """The excepthook ``_abort_on_uncaught_errors`` installs: it aborts the MPI job, or calls
    the hook it replaced (``previous``) once MPI is finalised, for one-rank jobs, and for
    KeyboardInterrupt and SystemExit."""

    _fw_mpi_abort = True  # fw's hook is there already: install it once

    def __init__(self, previous: Callable[[type[BaseException], BaseException, TracebackType | None], Any]) -> None:
        self.previous = previous

    def __call__(self, exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> Any:
        from mpi4py import MPI

        live = MPI.Is_initialized() and not MPI.Is_finalized() and MPI.COMM_WORLD.Get_size() > 1
        if not live or issubclass(exc_type, (KeyboardInterrupt, SystemExit)):
            return self.previous(exc_type, exc, tb)
        abort_mpi_job(exc.with_traceback(tb))
        return None
