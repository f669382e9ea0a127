"""One benchmark job's processes: who they are and the groups they talk over.

A job is ``single`` (one process), ``gloo`` (started by torchrun, srun or fw bench itself through
torch's elastic agent), ``mpi`` (started by mpiexec) or ``nccl`` (torchrun, one process per GPU).
Every multi-process job has a Gloo default group; an MPI job adds an ``fw_mpi`` group (the
order that works, see ``framework/strategies/mpi/backend.py``) and keeps mpi4py's communicator
for the raw MPI side; an NCCL job adds an NCCL group.
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

TIMEOUT = datetime.timedelta(seconds=300)
MPI_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK")


def launched_by() -> str | None:
    """``torchrun``, ``mpi``, ``slurm`` (srun with more than one task) or None."""
    if "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ):
        return "torchrun"
    if any(v in os.environ for v in MPI_VARS):
        return "mpi"
    from framework.environments.slurm import in_job_step

    if int(os.environ.get("SLURM_NTASKS", os.environ.get("SLURM_NPROCS", "1")) or 1) > 1 and in_job_step(os.environ):
        return "slurm"
    return None


@dataclass
class Job:
    kind: str  # single, gloo, mpi, nccl
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    local_world: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    mpi: Any = None  # mpi4py COMM_WORLD in an MPI job
    mpi_group: Any = None  # the fw_mpi process group
    nccl_group: Any = None  # the default group of an NCCL job
    cpu_group: Any = None  # Gloo: the default group, or a Gloo group beside NCCL

    @property
    def name(self) -> str:
        return f"{self.kind}-{self.world}"

    def max_over_ranks(self, values: list[float]) -> list[float]:
        """Element-wise maximum of ``values`` over the ranks (the slowest rank's times)."""
        if self.world == 1:
            return list(values)
        if self.mpi is not None:
            return [max(col) for col in zip(*self.mpi.allgather(list(values)), strict=True)]
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.cpu_group)
        return t.tolist()

    def agree(self, value: float) -> float:
        """The largest ``value`` over the ranks (so every rank takes the same decision)."""
        return self.max_over_ranks([value])[0]

    def barrier(self) -> None:
        if self.world == 1:
            return
        if self.mpi is not None:
            self.mpi.Barrier()
        else:
            dist.barrier(group=self.cpu_group)

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` on every rank."""
        if self.world == 1:
            return [obj]
        if self.mpi is not None:
            return self.mpi.allgather(obj)
        out = [None] * self.world
        dist.all_gather_object(out, obj, group=self.cpu_group)
        return out

    def close(self) -> None:
        from framework.strategies.distributed import destroy_process_groups

        if dist.is_initialized():
            destroy_process_groups(barrier=True, group=self.cpu_group)


def start_job(kind: str | None = None) -> Job:
    """Join the job this process was started in (or a one-process job) and set its threads:
    each process gets an equal share of the cores, as fw's DDP strategies give it."""
    if kind is None:
        kind = {"torchrun": "gloo", "slurm": "gloo", "mpi": "mpi", None: "single"}[launched_by()]
        local = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("SLURM_NTASKS_PER_NODE", "1")).split("(")[0] or 1)
        if kind == "gloo" and torch.cuda.is_available() and torch.cuda.device_count() >= local:
            kind = "nccl"  # one GPU per process, as fw's ddp_nccl would use them
    if kind == "single":
        job = Job("single")
        if torch.cuda.is_available() and os.environ.get("FW_BENCH_DEVICE", "cpu") == "cuda":
            job.device = torch.device("cuda", 0)
        return job
    job = _start_mpi() if kind == "mpi" else _start_env(kind)
    local = max(1, job.local_world)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // local))
    return job


def _start_env(kind: str) -> Job:
    """torchrun (or srun: fw's SLURM environment gives the rendezvous address)."""
    from framework.environments import detect_environment

    info = detect_environment().info()
    os.environ.setdefault("MASTER_ADDR", info.master_addr)
    os.environ.setdefault("MASTER_PORT", str(info.master_port or 29500))
    job = Job(kind, info.rank, info.world_size, info.local_rank, info.local_world_size)
    if kind == "nccl":
        job.device = torch.device("cuda", info.local_rank)
        torch.cuda.set_device(job.device)
    # NCCL is the default group of an NCCL job (fw's ddp_nccl uses the group it finds)
    dist.init_process_group("nccl" if kind == "nccl" else "gloo", rank=info.rank, world_size=info.world_size,
                            timeout=TIMEOUT)
    job.nccl_group = dist.group.WORLD if kind == "nccl" else None
    job.cpu_group = dist.new_group(backend="gloo") if kind == "nccl" else dist.group.WORLD
    return job


def _start_mpi() -> Job:
    from mpi4py import MPI

    from framework.strategies.mpi.backend import register_mpi_backend

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    hosts = comm.allgather(socket.gethostname())
    address = "127.0.0.1" if len(set(hosts)) == 1 else hosts[0]
    port = None
    if rank == 0:
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
    port = comm.bcast(port, root=0)
    dist.init_process_group("gloo", init_method=f"tcp://{address}:{port}", rank=rank, world_size=size, timeout=TIMEOUT)
    job = Job("mpi", rank, size, local.Get_rank(), local.Get_size(), mpi=comm, cpu_group=dist.group.WORLD)
    job.mpi_group = dist.new_group(backend=register_mpi_backend(), timeout=TIMEOUT)
    return job


def say(job: Job, message: str) -> None:
    """A progress line on stderr, from rank 0."""
    if job.rank == 0:
        sys.stderr.write(f"fw bench [{job.name}] {message}\n")
        sys.stderr.flush()
