"""``KubeflowEnvironment``: a pod of a Kubeflow training job, where fw starts the pod's processes.

Kubeflow runs one container per pod and tells it where the pod stands, in one of two ways:

- **Trainer v2** (``TrainJob``, ``trainer.kubeflow.org/v1alpha1``, torch runtime): every node's
  container gets ``PET_NNODES``, ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK``, ``PET_MASTER_ADDR``
  and ``PET_MASTER_PORT``, the variables torchrun reads as the defaults of ``--nnodes``,
  ``--nproc-per-node``, ``--node-rank``, ``--master-addr`` and ``--master-port``. A command
  ``torchrun ... -m framework.cli fit ...`` needs nothing from this file: torchrun reads them and
  its workers are ``TorchElasticEnvironment``'s. A plain ``fw fit recipe.yaml`` is read here, and
  fw's launcher does what torchrun would: ``PET_NPROC_PER_NODE`` workers in this pod, node rank
  ``PET_NODE_RANK``, meeting at ``PET_MASTER_ADDR:PET_MASTER_PORT`` (torchrun's static
  rendezvous).
- **The legacy PyTorchJob** (``kubeflow.org/v1``, training-operator): ``MASTER_ADDR``,
  ``MASTER_PORT``, ``RANK`` = the pod's index (the Master is 0, Worker ``i`` is ``i + 1``) and
  ``WORLD_SIZE`` = the number of pods, not of processes (kubeflow/trainer#1790), besides
  ``PYTHONUNBUFFERED=1``. Read as torchrun's ``RANK``/``WORLD_SIZE`` they would make each pod one
  rank, and a pod asked for two devices would train beside a world that does not count them.
  fw reads them as pods: it starts ``trainer.devices`` processes in each pod (one is fine), and
  global rank = pod index * processes per pod + local rank, world size = pods * processes per pod.

Detection (``detect``): a Kubernetes container (``KUBERNETES_SERVICE_HOST``, which the kubelet
sets in every container) that is not a worker of torchrun or of fw's own launcher (no
``TORCHELASTIC_RUN_ID``, no ``LOCAL_RANK``: those workers inherit the pod's variables, and are
torchrun's), with the PyTorchJob's four variables or ``PET_NNODES``; a missing one of the
others is then named. An elastic job (``PET_NNODES=min:max``, or a PyTorchJob's
``elasticPolicy``: ``PET_RDZV_BACKEND``) is refused: its pods come and go, which torchrun's
c10d rendezvous handles, so its command must be ``torchrun``. Lightning's ``KubeflowEnvironment`` looks at
``KUBERNETES_PORT`` and the PyTorchJob's four variables too, but is not detected on its own and
takes ``WORLD_SIZE`` for processes (one per pod).

The job's shape must be the recipe's: ``trainer.num_nodes`` = the pods, and ``trainer.devices`` =
``PET_NPROC_PER_NODE`` where the operator sets an integer there (``numProcPerNode``,
``nprocPerNode``); ``auto``, ``cpu`` or ``gpu`` there leave the count to ``trainer.devices``. A
mismatch is refused in one line that names both sides (``check``). The operator, not fw, restarts
a failed pod (``restartPolicy``), so ``trainer.max_restarts`` is refused here: a restarted pod
resumes with ``ckpt_path=last`` (docs/guides/clouds/kubernetes.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from framework.environments.base import AssignedNode, ClusterEnvironment, env_int, env_str
from framework.environments.info import DistInfo
from framework.errors import ConfigError, DistributedSetupError

#: what the kubelet sets in every container: this process runs on Kubernetes
_IN_KUBERNETES = "KUBERNETES_SERVICE_HOST"
#: set in the workers of torchrun and of fw's launcher, which inherit the pod's variables
_TORCHRUN_WORKER = ("TORCHELASTIC_RUN_ID", "LOCAL_RANK")
_PYTORCHJOB = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")
#: set for an elastic job (PyTorchJob's elasticPolicy): torchrun's c10d rendezvous, not a fixed node rank
_ELASTIC = "PET_RDZV_BACKEND"
#: values of PET_NPROC_PER_NODE that leave the count to torchrun (here: to trainer.devices)
_COUNT_NOT_GIVEN = ("auto", "cpu", "gpu")


@dataclass(frozen=True)
class KubeflowPod:
    """Where a Kubeflow job put this pod, as its operator's variables say.

    Attributes:
        kind: ``"TrainJob"`` (Trainer v2, ``PET_*``) or ``"PyTorchJob"`` (the legacy operator).
        pods: the number of pods (nodes) in the job.
        index: this pod's index, ``0 <= index < pods``: its node rank.
        procs_per_pod: the processes per pod the job asks for (``PET_NPROC_PER_NODE``), or None
            when it leaves the count to ``trainer.devices``.
        master_addr, master_port: where the pods meet (the pod of index 0 hosts the store).
    """

    kind: str
    pods: int
    index: int
    procs_per_pod: int | None
    master_addr: str
    master_port: int

    @property
    def endpoint(self) -> str:
        return f"{self.master_addr}:{self.master_port}"

    def rank_info(self, procs_per_pod: int, local_rank: int = 0) -> DistInfo:
        """The ``DistInfo`` of the worker with ``local_rank`` in this pod when every pod runs
        ``procs_per_pod`` processes: rank = index * procs_per_pod + local_rank."""
        return DistInfo(
            rank=self.index * procs_per_pod + local_rank,
            local_rank=local_rank,
            world_size=self.pods * procs_per_pod,
            local_world_size=procs_per_pod,
            node_rank=self.index,
            num_nodes=self.pods,
            master_addr=self.master_addr,
            master_port=self.master_port,
            source=KubeflowEnvironment.name,
        )

    def summary(self, procs_per_pod: int) -> str:
        """The start-up line: ``Kubeflow PyTorchJob: pod 1 of 2, 2 processes per pod (ranks 2-3
        of 4), rendezvous at ADDR:PORT``."""
        first = self.index * procs_per_pod
        ranks = f"rank {first}" if procs_per_pod == 1 else f"ranks {first}-{first + procs_per_pod - 1}"
        plural = "process" if procs_per_pod == 1 else "processes"
        return (f"Kubeflow {self.kind}: pod {self.index} of {self.pods}, {procs_per_pod} {plural} per pod "
                f"({ranks} of {self.pods * procs_per_pod}), rendezvous at {self.endpoint}")


def read_pod(env: Mapping[str, str]) -> KubeflowPod:
    """Read the operator's variables (see the module docstring; the PyTorchJob's four win when
    both sets are there, as the legacy operator may set ``PET_*`` too).

    Raises:
        DistributedSetupError: a variable is missing, malformed, or out of range.
    """
    if all(key in env for key in _PYTORCHJOB):
        kind, keys = "PyTorchJob", ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT")
    else:
        kind, keys = "TrainJob", ("PET_NNODES", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")
    nodes = env.get("PET_NNODES", "")
    if ":" in nodes or _ELASTIC in env:
        said = f"PET_NNODES={nodes!r} is a range" if ":" in nodes else f"{_ELASTIC} is set"
        raise DistributedSetupError(
            f"Kubeflow {kind}: {said} (an elastic job, whose pods come and go); fw starts the processes of a fixed "
            "number of pods itself: run the command under torchrun (torchrun -m framework.cli fit ...), which "
            "handles elastic membership, or give the job a fixed number of nodes")
    pods_key, index_key, addr_key, port_key = keys
    pods = _required_int(env, kind, pods_key)
    index = _required_int(env, kind, index_key)
    port = _required_int(env, kind, port_key)
    addr = env_str(env, addr_key)
    if pods < 1 or not 0 <= index < pods:
        raise DistributedSetupError(f"Kubeflow {kind}: {index_key}={index} must be in [0, {pods_key}={pods})")
    if not addr:
        raise DistributedSetupError(f"Kubeflow {kind}: {addr_key} is empty")
    if not 1 <= port <= 65535:
        raise DistributedSetupError(f"Kubeflow {kind}: {port_key}={port} is not a port")
    return KubeflowPod(kind, pods, index, _procs_per_pod(env, kind), addr, port)


def _required_int(env: Mapping[str, str], kind: str, key: str) -> int:
    value = env_int(env, key)
    if value is None:
        raise DistributedSetupError(f"Kubeflow {kind}: {key} is not set")
    return value


def _procs_per_pod(env: Mapping[str, str], kind: str) -> int | None:
    raw = env_str(env, "PET_NPROC_PER_NODE")
    if raw is None or raw.lower() in _COUNT_NOT_GIVEN:
        return None
    try:
        count = int(raw)
    except ValueError:
        raise DistributedSetupError(f"Kubeflow {kind}: PET_NPROC_PER_NODE={raw!r} is neither a number nor one of "
                                    f"{', '.join(_COUNT_NOT_GIVEN)}") from None
    if count < 1:
        raise DistributedSetupError(f"Kubeflow {kind}: PET_NPROC_PER_NODE={count} must be >= 1")
    return count


class KubeflowEnvironment(ClusterEnvironment):
    """A pod of a Kubeflow TrainJob or PyTorchJob (see the module docstring): fw's launcher
    starts this pod's processes, numbered by the pod's index."""

    name = "kubeflow"

    @staticmethod
    def detect(env: Mapping[str, str]) -> bool:
        if _IN_KUBERNETES not in env or any(key in env for key in _TORCHRUN_WORKER):
            return False
        return all(key in env for key in _PYTORCHJOB) or "PET_NNODES" in env  # read_pod names what is missing

    def pod(self) -> KubeflowPod:
        """Where the operator put this pod."""
        return read_pod(self.env)

    def info(self) -> DistInfo:
        """This pod's first rank, before fw starts the pod's processes (one per pod when the job
        does not say how many)."""
        pod = self.pod()
        return pod.rank_info(pod.procs_per_pod or 1)

    @property
    def launched_externally(self) -> bool:
        return False  # the operator started one container per pod: its processes are fw's to start

    def check(self, devices: int, num_nodes: int) -> None:
        """The recipe's shape must be the job's: ``devices`` = the processes per pod the job
        names (if it names a number), ``num_nodes`` = the pods.

        Raises:
            ConfigError: they differ; the message names both sides and how to make them agree.
        """
        pod = self.pod()
        if pod.procs_per_pod is not None and pod.procs_per_pod != devices:
            field = "numProcPerNode" if pod.kind == "TrainJob" else "nprocPerNode"
            raise ConfigError(
                f"Kubeflow {pod.kind}: PET_NPROC_PER_NODE={pod.procs_per_pod} (the job's {field}) but trainer.devices="
                f"{devices}. HINT: set trainer.devices={pod.procs_per_pod}, or {field}: {devices} in the job")
        if pod.pods != num_nodes:
            field = "numNodes" if pod.kind == "TrainJob" else "Master + Worker replicas"
            counted = "PET_NNODES" if pod.kind == "TrainJob" else "WORLD_SIZE"
            alone = ": each pod would train alone" if num_nodes == 1 else ""
            raise ConfigError(
                f"Kubeflow {pod.kind}: {counted}={pod.pods} pods but trainer.num_nodes={num_nodes}{alone}. "
                f"HINT: set trainer.num_nodes={pod.pods}, or make {field} {num_nodes} in the job")

    def assigned_node(self, devices: int) -> AssignedNode:
        """For fw's launcher: this pod's index as its node rank, the job's master as the
        rendezvous, and the start-up line."""
        pod = self.pod()
        return AssignedNode(pod.index, pod.pods, pod.endpoint, pod.summary(devices))
