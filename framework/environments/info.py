"""``DistInfo``: where this process stands in a distributed job, as one frozen value.

A cluster environment (torchrun, SLURM, MPI, local) reads its launcher's variables once and
returns a ``DistInfo``; the launcher, strategy and accelerator receive that value instead of
reading ``os.environ`` again, so every layer agrees on the same rank and world size.
"""

from __future__ import annotations

from dataclasses import dataclass

from framework.errors import DistributedSetupError


@dataclass(frozen=True)
class DistInfo:
    """Rank, sizes and rendezvous address of this process.

    Attributes:
        rank: global rank, ``0 <= rank < world_size``.
        local_rank: rank among the processes of this node; picks the GPU.
        world_size: number of processes in the job.
        local_world_size: number of processes on this node.
        node_rank: index of this node, ``0 <= node_rank < num_nodes``.
        num_nodes: number of nodes in the job.
        master_addr: host that rank 0's rendezvous store listens on.
        master_port: its port; ``None`` when the environment does not define one (the
            launcher or strategy then picks a free port).
        source: which environment produced it: ``"torchrun"``, ``"slurm"``, ``"mpi"`` or
            ``"local"``.
    """

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    node_rank: int = 0
    num_nodes: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int | None = None
    source: str = "local"

    def __post_init__(self) -> None:
        problems = []
        if self.world_size < 1:
            problems.append(f"world_size={self.world_size} must be >= 1")
        if not 0 <= self.rank < max(self.world_size, 1):
            problems.append(f"rank={self.rank} must be in [0, world_size={self.world_size})")
        if not 1 <= self.local_world_size <= max(self.world_size, 1):
            problems.append(
                f"local_world_size={self.local_world_size} must be in "
                f"[1, world_size={self.world_size}]"
            )
        if not 0 <= self.local_rank < max(self.local_world_size, 1):
            problems.append(
                f"local_rank={self.local_rank} must be in "
                f"[0, local_world_size={self.local_world_size})"
            )
        if not 1 <= self.num_nodes <= max(self.world_size, 1):
            problems.append(
                f"num_nodes={self.num_nodes} must be in [1, world_size={self.world_size}]"
            )
        if not 0 <= self.node_rank < max(self.num_nodes, 1):
            problems.append(
                f"node_rank={self.node_rank} must be in [0, num_nodes={self.num_nodes})"
            )
        if self.master_port is not None and not 1 <= self.master_port <= 65535:
            problems.append(f"master_port={self.master_port} must be in [1, 65535]")
        if not self.master_addr:
            problems.append("master_addr is empty")
        if problems:
            raise DistributedSetupError(
                f"inconsistent distributed setup from {self.source}: " + "; ".join(problems)
            )

    @property
    def is_distributed(self) -> bool:
        """True when the job has more than one process."""
        return self.world_size > 1
