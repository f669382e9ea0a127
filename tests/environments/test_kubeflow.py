"""KubeflowEnvironment from the variables each Kubeflow operator sets (no cluster, no process):
detection against torchrun's workers, the rank arithmetic of pods x processes, the refusals of a
recipe whose shape is not the job's, and the launcher a Trainer builds in such a pod."""

from __future__ import annotations

import pytest

import framework as fw
from framework.environments import (
    AssignedNode,
    DistInfo,
    KubeflowEnvironment,
    LocalEnvironment,
    TorchElasticEnvironment,
    detect_environment,
)
from framework.environments.kubeflow import read_pod
from framework.errors import ConfigError, DistributedSetupError
from framework.strategies.launchers import ElasticLauncher

#: what the kubelet puts in every container (the API server's service)
KUBERNETES = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443",
              "KUBERNETES_PORT": "tcp://10.96.0.1:443", "HOSTNAME": "digits-worker-0"}


def pytorchjob(pod: int, pods: int, **extra: str) -> dict[str, str]:
    """A legacy PyTorchJob's container: RANK is the pod's index, WORLD_SIZE the pods."""
    return {**KUBERNETES, "MASTER_ADDR": "digits-master-0", "MASTER_PORT": "23456", "RANK": str(pod),
            "WORLD_SIZE": str(pods), "PYTHONUNBUFFERED": "1", **extra}


def trainjob(node: int, nodes: int, nproc: str = "2", **extra: str) -> dict[str, str]:
    """A Trainer v2 TrainJob's container (torch runtime): torchrun's defaults as PET_*."""
    return {**KUBERNETES, "PET_NNODES": str(nodes), "PET_NPROC_PER_NODE": nproc, "PET_NODE_RANK": str(node),
            "PET_MASTER_ADDR": "digits-node-0-0.digits", "PET_MASTER_PORT": "29400", **extra}


def torchrun_worker(pod_env: dict[str, str], rank: int, local_rank: int, nproc: int, nodes: int) -> dict[str, str]:
    """What a worker of torchrun (or of fw's launcher) in that pod sees: the pod's variables,
    with torchrun's over them."""
    return {**pod_env, "RANK": str(rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(nproc * nodes),
            "LOCAL_WORLD_SIZE": str(nproc), "GROUP_RANK": str(rank // nproc), "GROUP_WORLD_SIZE": str(nodes),
            "TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29400"}


@pytest.mark.parametrize(("env", "cls"), [
    (pytorchjob(1, 2), KubeflowEnvironment),
    (trainjob(1, 2), KubeflowEnvironment),
    (torchrun_worker(pytorchjob(1, 2), 3, 1, 2, 2), TorchElasticEnvironment),  # fw's launcher's worker in the pod
    (torchrun_worker(trainjob(1, 2), 3, 1, 2, 2), TorchElasticEnvironment),   # `torchrun ... fw` in a TrainJob
    ({k: v for k, v in pytorchjob(1, 2).items() if not k.startswith("KUBERNETES")}, TorchElasticEnvironment),
    ({k: v for k, v in trainjob(1, 2).items() if not k.startswith("KUBERNETES")}, LocalEnvironment),
    ({**KUBERNETES, "MASTER_ADDR": "a", "MASTER_PORT": "1"}, LocalEnvironment),  # a pod of something else
])
def test_detection(env: dict, cls: type) -> None:
    assert type(detect_environment(env, argv=[])) is cls


@pytest.mark.parametrize(("pods", "procs"), [(2, 1), (2, 2), (3, 4)])
def test_ranks_are_pod_index_times_processes_plus_local_rank(pods: int, procs: int) -> None:
    """Every (pod, local rank) gets its own global rank, pod-major, and the world counts them all."""
    seen = []
    for index in range(pods):
        pod = read_pod(pytorchjob(index, pods))
        for local in range(procs):
            info = pod.rank_info(procs, local)
            assert (info.world_size, info.local_world_size, info.num_nodes, info.node_rank) == \
                   (pods * procs, procs, pods, index)
            seen.append(info.rank)
    assert seen == list(range(pods * procs))


def test_pytorchjob_world_size_counts_pods_not_processes() -> None:
    environment = detect_environment(pytorchjob(1, 2), argv=[])
    assert not environment.launched_externally  # fw starts the pod's processes
    assert environment.info() == DistInfo(rank=1, local_rank=0, world_size=2, local_world_size=1, node_rank=1,
                                          num_nodes=2, master_addr="digits-master-0", master_port=23456,
                                          source="kubeflow")
    assert environment.assigned_node(2) == AssignedNode(
        1, 2, "digits-master-0:23456",
        "Kubeflow PyTorchJob: pod 1 of 2, 2 processes per pod (ranks 2-3 of 4), rendezvous at digits-master-0:23456")
    environment.check(2, 2)  # 2 processes in each of 2 pods: the recipe's devices=2, num_nodes=2


def test_trainjob_reads_pet_variables() -> None:
    pod = read_pod(trainjob(1, 3, nproc="4"))
    assert (pod.kind, pod.pods, pod.index, pod.procs_per_pod, pod.endpoint) == \
           ("TrainJob", 3, 1, 4, "digits-node-0-0.digits:29400")
    assert read_pod(trainjob(0, 2, nproc="auto")).procs_per_pod is None  # left to trainer.devices
    assert "pod 0 of 1, 1 process per pod (rank 0 of 1)" in read_pod(trainjob(0, 1)).summary(1)


@pytest.mark.parametrize(("env", "devices", "num_nodes", "words"), [
    (trainjob(0, 2, nproc="2"), 1, 2, "PET_NPROC_PER_NODE=2 (the job's numProcPerNode) but trainer.devices=1. "
                                      "HINT: set trainer.devices=2"),
    (pytorchjob(0, 2, PET_NPROC_PER_NODE="2"), 1, 2, "the job's nprocPerNode"),
    (pytorchjob(0, 2), 2, 1, "WORLD_SIZE=2 pods but trainer.num_nodes=1: each pod would train alone. "
                             "HINT: set trainer.num_nodes=2"),
    (trainjob(1, 3), 2, 2, "PET_NNODES=3 pods but trainer.num_nodes=2. HINT: set trainer.num_nodes=3"),
])
def test_a_recipe_of_another_shape_is_refused_in_one_line(env, devices, num_nodes, words) -> None:
    with pytest.raises(ConfigError) as err:
        KubeflowEnvironment(env=env, argv=[]).check(devices, num_nodes)
    assert words in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(("env", "words"), [
    (pytorchjob(2, 2), "RANK=2 must be in [0, WORLD_SIZE=2)"),
    (pytorchjob(0, 2, MASTER_PORT="x"), "MASTER_PORT='x' is not an integer"),
    (trainjob(0, 2, nproc="many"), "PET_NPROC_PER_NODE='many' is neither a number"),
    (trainjob(0, 2, PET_NNODES="1:4"), "PET_NNODES='1:4' is a range (an elastic job"),
    (pytorchjob(0, 2, PET_RDZV_BACKEND="c10d", PET_NNODES="2:4"), "run the command under torchrun"),
    ({k: v for k, v in trainjob(0, 2).items() if k != "PET_NODE_RANK"}, "Kubeflow TrainJob: PET_NODE_RANK is not set"),
])
def test_malformed_variables_are_named(env, words) -> None:
    with pytest.raises(DistributedSetupError, match=None) as err:
        read_pod(env)
    assert words in str(err.value)


def test_a_trainer_in_a_pod_builds_fw_launcher_with_the_pods_node_rank(monkeypatch) -> None:
    """devices=2 in pod 1 of a 2-pod PyTorchJob: fw's launcher starts 2 workers as node 1 (no
    process is started here: the launcher is only built)."""
    for key, value in pytorchjob(1, 2).items():
        monkeypatch.setenv(key, value)
    trainer = fw.Trainer(accelerator="cpu", devices=2, num_nodes=2, strategy="ddp_gloo", logger=False)
    assert isinstance(trainer.launcher, ElasticLauncher)
    assert trainer.launcher.node == AssignedNode(1, 2, "digits-master-0:23456", trainer.launcher.node.summary)
    assert (trainer.launcher.nproc_per_node, trainer.launcher.num_nodes) == (2, 2)


@pytest.mark.parametrize(("settings", "words"), [
    ({"devices": 1}, "each pod would train alone"),  # strategy auto -> single: refused, not trained alone
    ({"devices": 2, "num_nodes": 2, "strategy": "ddp_gloo", "max_restarts": 2}, "set trainer.max_restarts=0"),
    ({"devices": 2, "num_nodes": 2, "strategy": "ddp_gloo", "rdzv_endpoint": "10.1.1.1:5"}, "leave trainer.rdzv_endpoint"),
])
def test_a_trainer_refuses_what_contradicts_the_job(monkeypatch, settings, words) -> None:
    for key, value in pytorchjob(0, 2).items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ConfigError, match=words):
        fw.Trainer(accelerator="cpu", logger=False, **settings)


def test_torchrun_in_a_trainjob_refuses_a_recipe_of_another_shape() -> None:
    """``torchrun ... fw`` in a TrainJob: torchrun started PET_NPROC_PER_NODE=2 workers per node,
    and a recipe with devices=1 is refused by the torchrun environment's own check."""
    worker = TorchElasticEnvironment(env=torchrun_worker(trainjob(1, 2), 3, 1, 2, 2), argv=[])
    with pytest.raises(ConfigError, match=r"started 2 process\(es\) on this node but trainer.devices=1"):
        worker.check(1, 2)
    worker.check(2, 2)


def test_a_ray_train_worker_on_kuberay_is_not_a_kubeflow_pod() -> None:
    """Ray Train's workers (ray/train/torch/config.py) get RANK, LOCAL_RANK, WORLD_SIZE and
    MASTER_* in a Kubernetes pod too (KubeRay): LOCAL_RANK says a launcher numbered the processes."""
    ray_worker = {**KUBERNETES, "RANK": "1", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1",
                  "MASTER_ADDR": "10.0.0.7", "MASTER_PORT": "41000"}
    assert not KubeflowEnvironment.detect(ray_worker)
