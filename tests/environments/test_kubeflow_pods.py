"""Kubeflow jobs on one machine: each pod is a network namespace with its own address (the
``two_hosts`` namespaces of tests/distributed/test_multinode.py), and its container's command
starts there with exactly the variables the operator sets (the kubelet's ``KUBERNETES_*``, and
the PyTorchJob's ``MASTER_ADDR``/``MASTER_PORT``/``RANK``/``WORLD_SIZE``/``PYTHONUNBUFFERED`` or
the TrainJob's ``PET_*``): 2 pods x 2 processes (PyTorchJob) and 2 pods x 1 (TrainJob under fw and
under torchrun; PyTorchJob in the restart test). The trained weights equal, bit for bit, the same run under fw's own
launcher on one node with as many processes; a pod killed with SIGKILL mid-epoch and started again
by the "operator" (the same command and variables, as ``restartPolicy: OnFailure`` does) resumes
with ``ckpt_path=last`` and ends with the weights of the run never interrupted. Needs root and
iproute2, as test_multinode.py; skips otherwise."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import forked
import pytest
from timescale import scaled

from tests.distributed.helpers import REPO, _kill_tree, check_ok, clean_env, free_port, write_script
from tests.distributed.test_multinode import two_hosts  # noqa: F401 (the fixture: namespaces A and B)

pytestmark = pytest.mark.cluster  # two network namespaces: two pods on one machine

#: the kubelet's variables in every container (the API server's service)
KUBERNETES = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443",
              "KUBERNETES_SERVICE_PORT_HTTPS": "443", "KUBERNETES_PORT": "tcp://10.96.0.1:443",
              "KUBERNETES_PORT_443_TCP": "tcp://10.96.0.1:443", "KUBERNETES_PORT_443_TCP_PROTO": "tcp",
              "KUBERNETES_PORT_443_TCP_PORT": "443", "KUBERNETES_PORT_443_TCP_ADDR": "10.96.0.1"}

#: the job's program: argv = out name devices num_nodes ifname kill_rank kill_step; the same file
#: runs as the pod's command, in fw's launcher's workers, and as the one-node reference
SCRIPT = """
import json, os, sys, time
from torch.utils.data import DataLoader
import framework as fw
from framework.callbacks import ModelCheckpoint
import workload

out, name, devices, num_nodes, ifname = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
kill_rank, kill_step = int(sys.argv[6]), int(sys.argv[7])
marker = f"{out}/{name}.reached"
first_attempt = not os.path.exists(marker)

class Wait(fw.Callback):
    # rank kill_rank says it reached kill_step (mid-epoch) and waits there for the test's kill -9
    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if first_attempt and trainer.global_rank == kill_rank and trainer.global_step == kill_step:
            open(marker, "w").close()
            time.sleep(60)

fw.seed_everything(0)
model = workload.Regressor()
strategy = {"name": "ddp_gloo", "timeout": 60, **({"socket_ifname": ifname} if ifname != "-" else {})}
trainer = fw.Trainer(devices=devices, num_nodes=num_nodes, strategy=strategy, max_epochs=2, accelerator="cpu",
                     logger=False, enable_progress_bar=False, num_sanity_val_steps=0, use_distributed_sampler=True,
                     default_root_dir=f"{out}/{name}", callbacks=[Wait(), ModelCheckpoint(every_n_train_steps=2, save_last=True)])
trainer.fit(model, DataLoader(workload.regression_data(32), batch_size=2, shuffle=True), ckpt_path="last")
env = trainer.environment.info()
with open(f"{out}/{name}_rank{trainer.global_rank}.json", "w") as f:
    json.dump({"rank": trainer.global_rank, "world": trainer.world_size, "local_rank": env.local_rank,
               "node_rank": env.node_rank, "source": env.source, "step": trainer.global_step,
               "w": [p.detach().flatten().tolist() for p in model.parameters()]}, f)
"""


def pytorchjob(index: int, pods: int, master: str, port: int) -> dict[str, str]:
    """What the training-operator sets in a PyTorchJob's container (``pkg/controller.v1/pytorch``:
    the master's service, the pod's index as RANK, the replicas as WORLD_SIZE)."""
    return {**KUBERNETES, "MASTER_ADDR": master, "MASTER_PORT": str(port), "RANK": str(index),
            "WORLD_SIZE": str(pods), "PYTHONUNBUFFERED": "1"}


def trainjob(index: int, pods: int, procs: int, master: str, port: int) -> dict[str, str]:
    """What Trainer v2's torch plugin sets in a TrainJob node's container."""
    return {**KUBERNETES, "PET_NNODES": str(pods), "PET_NPROC_PER_NODE": str(procs), "PET_NODE_RANK": str(index),
            "PET_MASTER_ADDR": master, "PET_MASTER_PORT": str(port)}


class Pods:
    """The two pods' containers: start each in its namespace, wait, kill; reaped at the end."""

    def __init__(self, hosts, script: Path, out: Path) -> None:
        self.names, self.ifaces, self.addrs = hosts
        self.script, self.out = script, out
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, node: str, variables: dict[str, str], args: list[str], torchrun: bool = False) -> None:
        program = [str(self.script), str(self.out), *args]
        command = [sys.executable, "-m", "torch.distributed.run", *program] if torchrun else [sys.executable, *program]
        env = {**clean_env(), **variables}
        self.procs[node] = subprocess.Popen(["ip", "netns", "exec", self.names[node], *command], env=env, cwd=REPO,
                                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                            start_new_session=True)

    def wait(self, timeout: float = 120) -> dict[str, tuple[int, str]]:
        done = {}
        for node, proc in self.procs.items():
            output, _ = proc.communicate(timeout=scaled(timeout))
            done[node] = (proc.returncode, output)
        self.procs = {}
        return done

    def kill(self, node: str) -> str:
        """kill -9 of the pod's whole process tree (its container dies); what it printed."""
        proc = self.procs.pop(node)
        _kill_tree(proc.pid)
        return proc.communicate()[0]

    def reap(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                _kill_tree(proc.pid)
            proc.communicate()


@pytest.fixture
def pods(two_hosts, tmp_path):  # noqa: F811
    job = Pods(two_hosts, write_script(tmp_path, SCRIPT), tmp_path)
    try:
        yield job
    finally:
        job.reap()


def run_pods(pods: Pods, name: str, variables, procs: int, torchrun: bool = False, kill: tuple[int, int] = (-1, -1)):
    """Start the job's two pods (``variables(index, master, port)``); both must exit 0."""
    port = free_port()
    for index, node in enumerate("AB"):
        pods.start(node, variables(index, pods.addrs["A"], port),
                   [name, str(procs), "2", pods.ifaces[node], *map(str, kill)], torchrun=torchrun)
    done = pods.wait()
    for node, (code, output) in done.items():
        assert code == 0, f"pod {node} exited {code}:\n{output}\nother pod:\n{done['B' if node == 'A' else 'A'][1]}"
    return done


def results(out: Path, name: str, world: int) -> list[dict]:
    return [json.loads((out / f"{name}_rank{rank}.json").read_text()) for rank in range(world)]


@pytest.fixture(scope="module")
def one_node(tmp_path_factory) -> dict[int, list[dict]]:
    """The same program on one node (no Kubernetes), 2 and 4 ranks as torchrun starts them
    (forked copies of this process, tests/forked.py: the ranks' training is the same, their start
    costs no interpreter; fw's launcher against torchrun is tests/distributed's): what the pods must
    reproduce bit for bit."""
    out = tmp_path_factory.mktemp("one_node")
    script = write_script(out, SCRIPT)
    found = {}
    for world in (2, 4):
        name = f"local{world}"
        check_ok(forked.run_script(script, str(out), name, str(world), "1", "-", "-1", "-1", nprocs=world,
                                   timeout=120, cwd=REPO))
        found[world] = results(out, name, world)
    return found


@pytest.mark.timeout(120)
def test_pytorchjob_pods_of_two_processes_train_as_fw_on_one_node_bit_for_bit(pods, one_node):
    """2 pods x 2 processes of a PyTorchJob (WORLD_SIZE=2 pods): fw starts 2 workers in each
    pod, ranks pod-major, and says so once per pod. (2 pods x 1 process: the restart test.)"""
    done = run_pods(pods, "job", lambda i, master, port: pytorchjob(i, 2, master, port), 2)
    got = results(pods.out, "job", 4)
    assert [(r["rank"], r["world"], r["node_rank"], r["local_rank"]) for r in got] == \
           [(0, 4, 0, 0), (1, 4, 0, 1), (2, 4, 1, 0), (3, 4, 1, 1)]
    assert all(r["source"] == "torchrun" for r in got)  # the pod's workers are fw's launcher's
    assert [r["step"] for r in got] == [8] * 4 and [r["w"] for r in got] == [r["w"] for r in one_node[4]]
    for index, node in enumerate("AB"):
        said = [line for line in done[node][1].splitlines() if "Kubeflow PyTorchJob" in line]
        assert said == [f"fw: Kubeflow PyTorchJob: pod {index} of 2, 2 processes per pod (ranks {2 * index}-"
                        f"{2 * index + 1} of 4), rendezvous at {pods.addrs['A']}:{said[0].rsplit(':', 1)[1]}"], \
            done[node][1]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("torchrun", [False, True], ids=["fw", "torchrun"])
def test_trainjob_pods_train_as_fw_on_one_node_bit_for_bit(pods, one_node, torchrun):
    """A TrainJob's 2 nodes x 1 process (PET_*): the pod's command is the plain program (fw
    starts the worker as torchrun would) or ``torchrun program`` (torchrun reads PET_*)."""
    done = run_pods(pods, "job", lambda i, master, port: trainjob(i, 2, 1, master, port), 1, torchrun=torchrun)
    got = results(pods.out, "job", 2)
    assert [(r["rank"], r["node_rank"], r["local_rank"]) for r in got] == [(0, 0, 0), (1, 1, 0)]
    assert [r["w"] for r in got] == [r["w"] for r in one_node[2]]
    said = [line for line in done["B"][1].splitlines() if "Kubeflow TrainJob" in line]
    expected = [] if torchrun else [f"fw: Kubeflow TrainJob: pod 1 of 2, 1 process per pod (rank 1 of 2), "
                                    f"rendezvous at {pods.addrs['A']}:{said[0].rsplit(':', 1)[1] if said else ''}"]
    assert said == expected, done["B"][1]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("victim", ["A"])
def test_a_pod_killed_mid_epoch_and_restarted_by_the_operator_resumes_exactly(pods, one_node, victim):
    """kill -9 of a pod's whole process tree at step 3 of 16 (mid-epoch; checkpoints every 2
    steps): pod A, which hosts the job's store. The other pod's worker fails on the lost peer and
    its container exits non-zero; the "operator" starts both containers again with the same
    variables; they resume from last.ckpt (step 2) and end with the weights of the run never
    interrupted (the one-node run, which the pods equal bit for bit).

    2 pods x 1 process, the fewest processes a restart needs (4-rank resume is proved bit for bit
    by tests/distributed/test_resume_four_ranks.py).
    """
    port, survivor = free_port(), "A" if victim == "B" else "B"
    variables = {index: pytorchjob(index, 2, pods.addrs["A"], port) for index in (0, 1)}
    kill_rank = "AB".index(victim)
    args = {node: ["job", "1", "2", pods.ifaces[node], str(kill_rank), "3"] for node in "AB"}
    for index, node in enumerate("AB"):
        pods.start(node, variables[index], args[node])
    marker, end = pods.out / "job.reached", time.monotonic() + scaled(90)
    while not marker.exists() and time.monotonic() < end and all(p.poll() is None for p in pods.procs.values()):
        time.sleep(0.05)
    assert marker.exists(), f"pod {victim} never reached step 3"
    killed_output = pods.kill(victim)
    code, output = pods.wait(timeout=90)[survivor]
    assert code != 0, f"pod {survivor} survived its peer's loss:\n{output}"
    for index, node in enumerate("AB"):  # the operator restarts the containers (restartPolicy: OnFailure)
        pods.start(node, variables[index], args[node])
    done = pods.wait()
    for node, (code, text) in done.items():
        assert code == 0, f"restarted pod {node} exited {code}:\n{text}\nbefore the kill:\n{killed_output}"
    assert "last.ckpt (step 2)" in done["A"][1], done["A"][1]
    assert "fw: Kubeflow PyTorchJob: pod 1 of 2, 1 process per pod (rank 1 of 2)" in done["B"][1], done["B"][1]
    got = results(pods.out, "job", 2)
    assert [(r["rank"], r["world"], r["node_rank"], r["local_rank"]) for r in got] == [(0, 2, 0, 0), (1, 2, 1, 0)]
    assert [r["step"] for r in got] == [16] * 2
    assert [r["w"] for r in got] == [r["w"] for r in one_node[2]]
