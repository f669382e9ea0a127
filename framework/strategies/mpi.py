"""DDP whose communication runs over MPI, for jobs started with ``mpirun``/``mpiexec``.

PyTorch wheels carry no native MPI backend. When torch has one, ``init_process_group("mpi")``
is used; otherwise ``framework.strategies.mpi_backend`` registers a ProcessGroup backed by mpi4py
(backend ``fw_mpi``), so unmodified DDP (bucketing, ``no_sync``, its options) and every
collective of the framework move data over MPI, with no ports to open.

Ranks come from the MPI launcher. Without one, ``fw fit`` with ``devices > 1`` refuses with the
command to run (MPI jobs are started by ``mpiexec``, not by fw). An exception on one rank aborts
the whole job through ``MPI.COMM_WORLD.Abort`` so that no rank waits forever in a collective
(MPI collectives have no timeout).
"""

from __future__ import annotations

import datetime
import sys
import traceback

import torch

from framework.errors import DistributedSetupError
from framework.strategies.ddp import DDPStrategy


class MPIStrategy(DDPStrategy):
    name = "mpi"

    def __init__(self, timeout: float = 1800, **ddp_options) -> None:
        ddp_options.pop("init_method", None)
        super().__init__(backend="gloo", timeout=timeout, **ddp_options)
        self.name = self.init_method = "mpi"

    def _init_process_group(self) -> None:
        from framework.strategies.mpi_backend import init_mpi_process_group

        rank, world_size = init_mpi_process_group(datetime.timedelta(seconds=self.timeout))
        if (rank, world_size) != (self.dist.rank, self.dist.world_size):
            raise DistributedSetupError(
                f"MPI reports rank {rank} of {world_size} but the launcher's variables say "
                f"{self.dist.rank} of {self.dist.world_size}; run fw under one mpiexec"
            )

    def setup_environment(self) -> None:
        super().setup_environment()
        self.backend = torch.distributed.get_backend()  # fw_mpi, or mpi when torch has it

    def barrier(self, name: str | None = None) -> None:
        torch.distributed.barrier()

    def _collective_device(self) -> torch.device:
        return torch.device("cpu")

    def on_exception(self, exc: BaseException) -> None:
        """Print this rank's error, then abort every rank of the MPI job."""
        if self.world_size <= 1:
            return
        traceback.print_exception(type(exc), exc, exc.__traceback__)
        sys.stderr.write(f"fw: rank {self.global_rank} failed; aborting the MPI job\n")
        sys.stderr.flush()
        from mpi4py import MPI

        MPI.COMM_WORLD.Abort(1)
