"""``MPIEnvironment``: ranks started by ``mpirun`` / ``mpiexec``.

Each MPI implementation names its variables differently:

| | rank | size | local rank | local size |
|---|---|---|---|---|
| Open MPI | ``OMPI_COMM_WORLD_RANK`` | ``..._SIZE`` | ``..._LOCAL_RANK`` | ``..._LOCAL_SIZE`` |
| MPICH / Intel MPI | ``PMI_RANK`` | ``PMI_SIZE`` | ``MPI_LOCALRANKID`` | ``MPI_LOCALNRANKS`` |
| MVAPICH | ``PMI_RANK`` | ``PMI_SIZE`` | ``MV2_COMM_WORLD_LOCAL_RANK`` | ``..._LOCAL_SIZE`` |
| PMIx launchers | ``PMIX_RANK`` | | | |

What the variables do not say is asked of mpi4py (``COMM_WORLD`` and a
``Split_type(COMM_TYPE_SHARED)`` communicator for the node). mpi4py is imported only then,
because importing ``mpi4py.MPI`` initializes MPI. Open MPI also gives the node rank
(``OMPI_COMM_WORLD_NODE_RANK``); elsewhere it is ``rank // local_world_size``, which holds for
the usual block placement of ranks on nodes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from framework.environments.base import ClusterEnvironment, env_int, env_str
from framework.environments.info import DistInfo
from framework.errors import DistributedSetupError

_RANK_KEYS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
_SIZE_KEYS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
_LOCAL_RANK_KEYS = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK")
_LOCAL_SIZE_KEYS = ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "MV2_COMM_WORLD_LOCAL_SIZE")
_DETECT_KEYS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK")


class MPIWorld(NamedTuple):
    """What mpi4py reports: global and node-local rank and size."""

    rank: int
    size: int
    local_rank: int
    local_size: int


def query_mpi4py() -> MPIWorld | None:
    """Ask mpi4py (initializing MPI) for ranks and sizes; None when mpi4py is unusable."""
    try:
        from mpi4py import MPI
    except (ImportError, RuntimeError):
        return None
    world = MPI.COMM_WORLD
    node = world.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return MPIWorld(world.Get_rank(), world.Get_size(), node.Get_rank(), node.Get_size())
    finally:
        node.Free()


class MPIEnvironment(ClusterEnvironment):
    """Reads Open MPI, MPICH/Intel MPI (hydra), MVAPICH or PMIx variables."""

    name = "mpi"

    @staticmethod
    def detect(env: Mapping[str, str]) -> bool:
        return any(key in env for key in _DETECT_KEYS)

    def info(self) -> DistInfo:
        env = self.env
        rank = env_int(env, *_RANK_KEYS)
        size = env_int(env, *_SIZE_KEYS)
        local_rank = env_int(env, *_LOCAL_RANK_KEYS)
        local_size = env_int(env, *_LOCAL_SIZE_KEYS)
        if rank is None or size is None or local_rank is None or local_size is None:
            world = self._query_mpi()
            if world is None:
                if rank is None or size is None:
                    raise DistributedSetupError(
                        "MPI launcher detected but the rank or world size is not in the "
                        "environment and mpi4py is not installed: pip install mpi4py"
                    )
                # Without mpi4py, assume all ranks share one node.
                world = MPIWorld(rank, size, rank, size)
            rank = world.rank if rank is None else rank
            size = world.size if size is None else size
            local_rank = world.local_rank if local_rank is None else local_rank
            local_size = world.local_size if local_size is None else local_size
        node_rank = env_int(env, "OMPI_COMM_WORLD_NODE_RANK", default=rank // local_size)
        num_nodes = -(-size // local_size)  # ceil: the last node may hold fewer ranks
        return DistInfo(
            rank=rank,
            local_rank=local_rank,
            world_size=size,
            local_world_size=local_size,
            node_rank=node_rank,
            num_nodes=max(num_nodes, node_rank + 1),
            master_addr=env_str(env, "MASTER_ADDR", default="127.0.0.1"),
            master_port=env_int(env, "MASTER_PORT"),
            source=self.name,
        )

    def _query_mpi(self) -> MPIWorld | None:
        """Hook for tests: the mpi4py answer for what the variables leave out."""
        return query_mpi4py()
