"""``SLURMEnvironment``: tasks started by ``srun``, one process per device.

What ``srun`` sets in each task (Slurm 22.05):
``SLURM_PROCID`` (global rank), ``SLURM_LOCALID`` (local rank), ``SLURM_NTASKS`` (world size),
``SLURM_NODEID`` (node rank), ``SLURM_NNODES``, ``SLURM_STEP_NODELIST`` / ``SLURM_NODELIST``
(hostlist), ``SLURM_JOB_ID``, ``SLURM_STEP_ID`` and ``SLURM_TASKS_PER_NODE`` (e.g. ``2(x3),1``).
The step variables (``SLURM_STEP_NUM_TASKS``...) win over the job ones when both are set,
because a step may use only part of the allocation.

Master address: ``MASTER_ADDR`` when set, else the first host of the fully expanded node list.
Master port: ``MASTER_PORT`` when set, else ``15000 + (last four digits of SLURM_JOB_ID)``,
a port in 15000..24999 that every task of the job computes alike without talking to the
others (Lightning uses the same rule, so habits carry over).

The batch-script trap: inside an ``sbatch`` script (or ``salloc``) but outside ``srun``,
``SLURM_NTASKS=2`` and ``SLURM_PROCID=0`` are set with no ``SLURM_STEP_ID``; that process is
not rank 0 of 2, and trusting it would wait forever for a rank 1 that never starts. ``detect``
therefore requires a job step, and ``check_slurm_batch_trap`` turns the situation into a clear
error when the run asked for more than one process.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from framework.environments.base import ClusterEnvironment, env_int, env_str, require_int
from framework.environments.hostlist import expand_hostlist
from framework.environments.info import DistInfo
from framework.errors import ConfigError, DistributedSetupError

_TASKS_ITEM = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")
_STEP_ID_KEYS = ("SLURM_STEP_ID", "SLURM_STEPID")


def parse_tasks_per_node(spec: str) -> list[int]:
    """Expand ``SLURM_TASKS_PER_NODE`` such as ``2(x3),1`` into ``[2, 2, 2, 1]``.

    Raises:
        DistributedSetupError: the value does not have that form.
    """
    counts: list[int] = []
    for item in spec.split(","):
        match = _TASKS_ITEM.match(item.strip())
        if not match:
            raise DistributedSetupError(f"cannot parse SLURM_TASKS_PER_NODE={spec!r}")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def master_port_from_job_id(job_id: str) -> int:
    """Return ``15000 + int(last four digits of job_id)``: the same port on every task."""
    digits = re.sub(r"\D", "", job_id)
    if not digits:
        raise DistributedSetupError(f"SLURM_JOB_ID={job_id!r} has no digits")
    return 15000 + int(digits[-4:])


def in_job_step(env: Mapping[str, str]) -> bool:
    """True when this process is a task of an ``srun`` job step (not the batch shell)."""
    return "SLURM_PROCID" in env and any(key in env for key in _STEP_ID_KEYS)


class SLURMEnvironment(ClusterEnvironment):
    """Reads the variables that ``srun`` gives each task."""

    name = "slurm"

    @staticmethod
    def detect(env: Mapping[str, str]) -> bool:
        return in_job_step(env)

    def info(self) -> DistInfo:
        env = self.env
        rank = require_int(env, self.name, "SLURM_PROCID")
        world_size = require_int(env, self.name, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
        num_nodes = env_int(env, "SLURM_STEP_NUM_NODES", "SLURM_NNODES", default=1)
        node_rank = env_int(env, "SLURM_NODEID", default=0)
        tasks = env_str(env, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
        if tasks is not None:
            per_node = parse_tasks_per_node(tasks)
            if node_rank >= len(per_node):
                raise DistributedSetupError(
                    f"SLURM_NODEID={node_rank} but SLURM_TASKS_PER_NODE={tasks!r} "
                    f"lists only {len(per_node)} node(s)"
                )
            local_world_size = per_node[node_rank]
        else:
            local_world_size = max(world_size // max(num_nodes, 1), 1)
        local_rank = env_int(env, "SLURM_LOCALID", default=rank % local_world_size)
        return DistInfo(
            rank=rank,
            local_rank=local_rank,
            world_size=world_size,
            local_world_size=local_world_size,
            node_rank=node_rank,
            num_nodes=num_nodes,
            master_addr=self._master_addr(),
            master_port=self._master_port(),
            source=self.name,
        )

    def check(self, devices: int, num_nodes: int) -> None:
        """SLURM's own hint first (one task per device: ``--ntasks-per-node``), then the
        general shape check."""
        check_tasks_per_node(self.info(), devices)
        super().check(devices, num_nodes)

    def _master_addr(self) -> str:
        addr = env_str(self.env, "MASTER_ADDR")
        if addr:
            return addr
        nodelist = env_str(
            self.env, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"
        )
        if not nodelist:
            return "127.0.0.1"
        try:
            hosts = expand_hostlist(nodelist)
        except ValueError as err:
            raise DistributedSetupError(f"cannot expand the SLURM node list: {err}") from None
        return hosts[0] if hosts else "127.0.0.1"

    def _master_port(self) -> int | None:
        port = env_int(self.env, "MASTER_PORT")
        if port is not None:
            return port
        job_id = env_str(self.env, "SLURM_JOB_ID", "SLURM_JOBID")
        return master_port_from_job_id(job_id) if job_id else None


def check_slurm_batch_trap(env: Mapping[str, str], requested_world_size: int) -> None:
    """Refuse to start a multi-process run from the batch shell of a multi-task job.

    Call it when no launcher was detected and the run asks for ``requested_world_size``
    processes. It does nothing outside SLURM, inside a job step, under torchrun or MPI, or when
    one process was requested.

    Raises:
        DistributedSetupError: ``SLURM_NTASKS > 1`` but this process is not a task of a step.
    """
    from framework.environments.mpi import MPIEnvironment
    from framework.environments.torchrun import TorchElasticEnvironment

    if requested_world_size <= 1 or in_job_step(env):
        return
    if TorchElasticEnvironment.detect(env) or MPIEnvironment.detect(env):
        return
    ntasks = env_int(env, "SLURM_NTASKS", "SLURM_NPROCS")
    if "SLURM_JOB_ID" not in env or ntasks is None or ntasks <= 1:
        return
    raise DistributedSetupError(
        f"inside an sbatch script but outside srun: SLURM_NTASKS={ntasks} but this process is "
        "not a task of a job step; start the job with `srun fw fit ...` so that SLURM starts "
        f"the {ntasks} tasks (one per device), or request a single task (--ntasks=1) and let "
        "fw start its own workers"
    )


def check_tasks_per_node(info: DistInfo, devices: int) -> None:
    """Check that SLURM started one task per requested device on this node.

    Raises:
        ConfigError: ``info.local_world_size != devices``.
    """
    if info.local_world_size == devices:
        return
    raise ConfigError(
        f"SLURM started {info.local_world_size} task(s) on this node but trainer.devices="
        f"{devices}; fw runs one process per device. HINT: set trainer.devices="
        f"{info.local_world_size} to match --ntasks-per-node, or run srun with "
        f"--ntasks-per-node={devices}"
    )
