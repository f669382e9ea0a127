"""Cluster environments: who launched this process, and where it stands.

``detect_environment()`` looks at the variables once and returns the first environment that
recognizes them, in this order:

1. ``ray`` (``RayTrainEnvironment``): a worker of Ray Train's ``TorchTrainer`` (torchrun's
   variables, and ``RAY_RAYLET_PID`` of a process a Ray node started; not under torchrun).
2. ``kubeflow`` (``KubeflowEnvironment``): a pod of a Kubeflow TrainJob (``PET_*``) or legacy
   PyTorchJob (``RANK`` = the pod's index, ``WORLD_SIZE`` = the pods) that is not itself a
   worker of torchrun; fw's launcher starts the pod's processes. It comes before torchrun
   because a PyTorchJob's ``RANK``/``WORLD_SIZE`` count pods, not processes.
3. ``torchrun`` (``TorchElasticEnvironment``): ``RANK`` + ``WORLD_SIZE`` or
   ``TORCHELASTIC_RUN_ID``. It comes before SLURM and MPI because torchrun may itself run inside ``srun`` or
   ``mpirun`` (one agent per node), and then its workers' ranks are torchrun's, not SLURM's.
4. ``slurm`` (``SLURMEnvironment``): a task of an ``srun`` job step.
5. ``mpi`` (``MPIEnvironment``): ``mpirun`` / ``mpiexec`` (Open MPI, MPICH, Intel MPI, PMIx).
6. ``local`` (``LocalEnvironment``): nothing; fw starts its own workers if it needs any.

Its ``info()`` gives a frozen ``DistInfo`` that the rest of fw passes around.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from framework.environments.base import AssignedNode, ClusterEnvironment
from framework.environments.hostlist import expand_hostlist, parse_hostlist
from framework.environments.info import DistInfo
from framework.environments.kubeflow import KubeflowEnvironment, KubeflowPod
from framework.environments.local import LocalEnvironment
from framework.environments.mpi import MPIEnvironment
from framework.environments.ray import RayTrainEnvironment
from framework.environments.slurm import (
    SLURMEnvironment,
    check_slurm_batch_trap,
    check_tasks_per_node,
)
from framework.environments.torchrun import TorchElasticEnvironment
from framework.errors import ConfigError, did_you_mean

#: Detection order: the first whose ``detect`` is true wins; ``local`` always matches.
ENVIRONMENTS: tuple[type[ClusterEnvironment], ...] = (
    RayTrainEnvironment,
    KubeflowEnvironment,
    TorchElasticEnvironment,
    SLURMEnvironment,
    MPIEnvironment,
    LocalEnvironment,
)

__all__ = [
    "ENVIRONMENTS",
    "AssignedNode",
    "ClusterEnvironment",
    "DistInfo",
    "KubeflowEnvironment",
    "KubeflowPod",
    "LocalEnvironment",
    "MPIEnvironment",
    "RayTrainEnvironment",
    "SLURMEnvironment",
    "TorchElasticEnvironment",
    "check_slurm_batch_trap",
    "check_tasks_per_node",
    "detect_environment",
    "expand_hostlist",
    "get_environment",
    "parse_hostlist",
]


def detect_environment(
    env: Mapping[str, str] | None = None, argv: Sequence[str] | None = None
) -> ClusterEnvironment:
    """Return the environment that launched this process (see the module docstring).

    Args:
        env: variables to inspect; ``os.environ`` when ``None``.
        argv: command line; ``sys.argv`` when ``None``.
    """
    variables = os.environ if env is None else env
    for cls in ENVIRONMENTS:
        if cls.detect(variables):
            return cls(env=variables, argv=argv)
    raise AssertionError("LocalEnvironment always detects")  # pragma: no cover


def get_environment(
    name: str, env: Mapping[str, str] | None = None, argv: Sequence[str] | None = None
) -> ClusterEnvironment:
    """Return the environment called ``name`` without detection (a recipe may force one).

    Raises:
        ConfigError: no environment has that name; the message lists the known ones.
    """
    by_name = {cls.name: cls for cls in ENVIRONMENTS}
    if name not in by_name:
        raise ConfigError(
            f"unknown cluster environment {name!r}{did_you_mean(name, by_name)}; "
            f"known: {', '.join(by_name)}"
        )
    return by_name[name](env=env, argv=argv)
