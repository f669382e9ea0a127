"""Two "nodes" on one machine: two network namespaces joined by a veth pair, each with its own
interface and address. fw's own launcher runs one worker per node (``num_nodes=2``,
``devices=1``), the rendezvous at node A's address, Gloo on the named interface; the result
equals one process on the 2x batch; a worker killed on either node restarts the job under fw's
launcher and under torchrun (one ``torchrun --nnodes 2`` per namespace). Needs root and iproute2
(CI has both); skips otherwise."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import torch
from timescale import scaled

from . import workload
from .helpers import REPO, _kill_tree, clean_env, free_port, write_script

pytestmark = pytest.mark.cluster  # two network namespaces: a cluster of two nodes on one machine

SCRIPT = """
import sys, torch
import workload
node, ifname, endpoint, out = sys.argv[1:5]
result = workload.fit_regressor({"name": "ddp_gloo", "socket_ifname": ifname}, devices=1, batch_size=4,
                                accumulate=1, num_nodes=2, rdzv_endpoint=endpoint)
torch.save(result, f"{out}/node{node}_rank{result['rank']}.pt")
"""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    probe = f"fwprobe{os.getpid()}"
    try:
        _ip("netns", "add", probe)
        _ip("netns", "del", probe)
    except (subprocess.CalledProcessError, OSError) as err:
        return f"cannot create network namespaces here ({err})"
    return None


@pytest.fixture(scope="module")
def two_hosts():
    """Namespaces A and B, veth pair A 10.231.N.1 <-> B 10.231.N.2; removed after the file's tests."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    tag = os.getpid() % 200 + 20
    names = {"A": f"fwA{tag}", "B": f"fwB{tag}"}
    ifaces = {"A": f"fwvA{tag}", "B": f"fwvB{tag}"}
    addrs = {"A": f"10.231.{tag}.1", "B": f"10.231.{tag}.2"}
    try:
        for ns in names.values():
            _ip("netns", "add", ns)
        _ip("link", "add", ifaces["A"], "type", "veth", "peer", "name", ifaces["B"])
        for node in "AB":
            _ip("link", "set", ifaces[node], "netns", names[node])
            _ip("-n", names[node], "addr", "add", f"{addrs[node]}/24", "dev", ifaces[node])
            _ip("-n", names[node], "link", "set", ifaces[node], "up")
            _ip("-n", names[node], "link", "set", "lo", "up")
        yield names, ifaces, addrs
    finally:
        for ns in names.values():
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)


@pytest.mark.timeout(60)
def test_two_nodes_over_their_own_interfaces_equal_one_process(two_hosts, tmp_path):
    script = write_script(tmp_path, SCRIPT)
    _run_on_both(two_hosts, script, tmp_path)
    a = torch.load(tmp_path / "nodeA_rank0.pt")
    b = torch.load(tmp_path / "nodeB_rank1.pt")
    assert a["world_size"] == b["world_size"] == 2
    single = workload.fit_regressor("single", devices=1, batch_size=8, accumulate=1)
    for key, value in single["state"].items():
        assert torch.equal(a["state"][key], b["state"][key])
        torch.testing.assert_close(a["state"][key], value, atol=1e-5, rtol=0)


RESTART_SCRIPT = """
import json, os, signal, sys, time
import torch, torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader
import framework as fw
from framework.callbacks import ModelCheckpoint
import workload

node, ifname, endpoint, out, name = sys.argv[1:6]
kill_rank, kill_step = int(sys.argv[6]), int(sys.argv[7])
marker = f"{out}/{name}.killed"  # the nodes' restart counts differ, so a file says "done once"
first_attempt = not os.path.exists(marker)  # read once: the killer writes it while the others run

class Dropout(workload.Regressor):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.2)
    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self.net(self.drop(x)), y)

class KillOnce(fw.Callback):
    # kills rank kill_rank at kill_step, once; the other rank is in a long step then, so its
    # worker is still healthy when the new round starts: its agent restarts it as a membership
    # change, which the agent does not count as a restart
    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if trainer.global_step != kill_step or not first_attempt:
            return
        if trainer.global_rank == kill_rank:
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        else:
            time.sleep(3)

# node "-": the same 2 ranks on one node (the uninterrupted reference, its ranks forked by the test)
where = dict(devices=2, strategy={"name": "ddp_gloo", "timeout": 60}) if node == "-" else \
    dict(devices=1, num_nodes=2, rdzv_endpoint=endpoint, strategy={"name": "ddp_gloo", "socket_ifname": ifname, "timeout": 60})
fw.seed_everything(0)
model = Dropout()
trainer = fw.Trainer(**where, max_epochs=2, accelerator="cpu", logger=False, enable_progress_bar=False,
                     num_sanity_val_steps=0, default_root_dir=f"{out}/{name}",
                     max_restarts=0 if kill_rank < 0 else 1,
                     callbacks=[KillOnce(), ModelCheckpoint(every_n_train_steps=1, save_top_k=-1)])
trainer.fit(model, DataLoader(workload.regression_data(64), batch_size=4, shuffle=True))
with open(f"{out}/{name}_rank{trainer.global_rank}.json", "w") as f:
    json.dump({"step": trainer.global_step, "restarts": os.environ.get("TORCHELASTIC_RESTART_COUNT"),
               "w": torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()}, f)
"""


def _run_on_both(two_hosts, script, tmp_path, *args: str, timeout: float = 120,
                 torchrun_restarts: int | None = None) -> dict[str, str]:
    """Run ``script NODE IFNAME ENDPOINT OUT *args`` in namespaces A and B; their outputs. With
    ``torchrun_restarts``, each node starts it under torchrun (1 worker, ``--max-restarts``
    that many), the rendezvous at node A's address; else as a plain program (fw's launcher)."""
    names, ifaces, addrs = two_hosts
    endpoint = f"{addrs['A']}:{free_port()}"

    def command(node: str) -> list[str]:
        program = [str(script), node, ifaces[node], endpoint, str(tmp_path), *args]
        if torchrun_restarts is None:
            return [sys.executable, *program]
        # the namespaces share the host's name, which resolves to neither veth address: each
        # node names its own address, and node A says that it hosts the rendezvous
        return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", "fw-two-nodes",
                "--rdzv-conf", f"is_host={int(node == 'A')}", "--local-addr", addrs[node],
                "--max-restarts", str(torchrun_restarts), *program]

    procs = {
        node: subprocess.Popen(
            ["ip", "netns", "exec", names[node], *command(node)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=clean_env(), cwd=REPO,
            start_new_session=True)
        for node in "AB"
    }
    outputs = {}
    try:
        for node, proc in procs.items():
            outputs[node], _ = proc.communicate(timeout=scaled(timeout))
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                _kill_tree(proc.pid)
                proc.communicate()
    for node, proc in procs.items():
        assert proc.returncode == 0, f"node {node} exited {proc.returncode}:\n{outputs.get(node)}\n" \
                                     f"other node:\n{outputs['B' if node == 'A' else 'A']}"
    return outputs


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> list[dict]:
    """The restart script's run never interrupted, per rank: its 2 ranks on one node, forked from
    this process as torchrun starts them (tests/forked.py; no launcher is under test in it, and a
    sum of two ranks' gradients is the same over either transport), so both launchers' killed
    two-node runs are held to this one run bit for bit."""
    import json

    import forked

    from .helpers import check_ok

    out = tmp_path_factory.mktemp("straight")
    check_ok(forked.run_script(write_script(out, RESTART_SCRIPT), "-", "-", "-", str(out), "straight", "-1", "-1",
                               nprocs=2, timeout=60))
    return [json.loads((out / f"straight_rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.timeout(80 + 80 * int(os.environ.get("FW_RESTART_REPEATS", "1")))  # ~12 s a kill alone, 68 s for one beside the suite
@pytest.mark.parametrize("launcher", ["fw", "torchrun"])
def test_a_worker_killed_on_either_node_restarts_both_and_resumes_bit_identically(two_hosts, tmp_path, launcher,
                                                                                  straight):
    """As tests/distributed/test_elastic_restart.py, across two nodes: the node whose worker
    died restarts it, the other node's agent restarts its own worker for the new round (without
    counting it: the nodes' ``TORCHELASTIC_RESTART_COUNT`` then differ), and both resume from the
    newest checkpoint of the run (``FW_RESTART_REPEATS`` kills, 1 unless set). Under fw's
    launcher (``num_nodes=2``, ``max_restarts=1``) or torchrun (``--nnodes 2 --max-restarts 1``
    on each node; fw takes its ranks)."""
    import json
    import random

    script = write_script(tmp_path, RESTART_SCRIPT)
    rng = random.Random()
    for attempt in range(int(os.environ.get("FW_RESTART_REPEATS", "1"))):
        rank, step = rng.randrange(2), rng.randrange(1, 16)
        name = f"killed{attempt}"
        outputs = _run_on_both(two_hosts, script, tmp_path, name, str(rank), str(step),
                               torchrun_restarts=1 if launcher == "torchrun" else None)
        assert (tmp_path / f"{name}.killed").exists(), outputs
        both = outputs["A"] + outputs["B"]
        assert "workers restarted by the elastic agent" in both and "resuming from" in both, both
        for r in (0, 1):
            got = json.loads((tmp_path / f"{name}_rank{r}.json").read_text())
            assert got["step"] == 16 and got["w"] == straight[r]["w"], \
                f"kill of rank {rank} at step {step}: rank {r} (restart count {got['restarts']})\n{both}"


SAME_HOST = """
import sys, torch
import workload
result = workload.fit_regressor("ddp_gloo", devices=1, batch_size=4, accumulate=1, num_nodes=2,
                                rdzv_endpoint=sys.argv[1])
torch.save(result, f"{sys.argv[2]}/rank{result['rank']}.pt")
"""


@pytest.mark.timeout(60)
def test_two_nodes_launched_on_one_host_at_once_find_each_other(tmp_path):
    """The two-node command of docs/guides/intermediate/multi-node.md, both 'nodes' on one machine
    and started together: both own the endpoint's address, one hosts the rendezvous and the other
    joins (was: EADDRINUSE)."""
    script = write_script(tmp_path, SAME_HOST)
    endpoint = f"127.0.0.1:{free_port()}"
    procs = [subprocess.Popen([sys.executable, str(script), endpoint, str(tmp_path)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=clean_env(), cwd=REPO, start_new_session=True)
             for _ in range(2)]
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=scaled(120))[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                _kill_tree(proc.pid)
                proc.communicate()
    assert all(proc.returncode == 0 for proc in procs), "\n".join(outputs)
    assert (tmp_path / "rank0.pt").exists() and (tmp_path / "rank1.pt").exists()


NODE_LOST = """
import os, sys, time
from torch.utils.data import DataLoader
import framework as fw
import workload

node, ifname, endpoint, out = sys.argv[1:5]

class Slow(workload.Regressor):
    def training_step(self, batch, batch_idx):
        time.sleep(0.05)
        if self.global_rank == 1 and self.global_step == 3:
            with open(f"{out}/launcher_of_rank1", "w") as f:
                f.write(str(os.getppid()))  # fw's launcher on node B
        return super().training_step(batch, batch_idx)

trainer = fw.Trainer(devices=1, num_nodes=2, rdzv_endpoint=endpoint, max_epochs=50, accelerator="cpu",
                     strategy={"name": "ddp_gloo", "socket_ifname": ifname, "timeout": 10}, logger=False,
                     enable_progress_bar=False, num_sanity_val_steps=0, enable_checkpointing=False,
                     default_root_dir=out)
trainer.fit(Slow(), DataLoader(workload.regression_data(64), batch_size=4))
"""


@pytest.mark.timeout(120)
def test_a_node_whose_launcher_dies_ends_the_job_on_the_other_node_naming_it(two_hosts, tmp_path):
    """kill -9 of node B's launcher: its worker (SIGTERM from the kernel) tells the others at their
    next stop check, every rank stops after the same step and helps write preempted.ckpt, and node A
    ends cleanly (exit 0) within the timeout, with one line that names the node it lost (its agent
    waited for B's only ``trainer.strategy.timeout``, not torch's 300 s)."""
    import signal
    import time

    names, ifaces, addrs = two_hosts
    script = write_script(tmp_path, NODE_LOST)
    endpoint = f"{addrs['A']}:{free_port()}"
    procs = {node: subprocess.Popen(
        ["ip", "netns", "exec", names[node], sys.executable, str(script), node, ifaces[node], endpoint, str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=clean_env(), cwd=REPO,
        start_new_session=True) for node in "AB"}
    outputs = {}
    try:
        marker, end = tmp_path / "launcher_of_rank1", time.monotonic() + 60
        while not marker.exists() and time.monotonic() < end and all(p.poll() is None for p in procs.values()):
            time.sleep(0.05)
        assert marker.exists(), "training did not start"
        time.sleep(0.2)
        os.kill(int(marker.read_text()), signal.SIGKILL)
        killed = time.monotonic()
        outputs["A"], _ = procs["A"].communicate(timeout=scaled(60))
        took = time.monotonic() - killed
    finally:
        for node, proc in procs.items():
            if proc.poll() is None:
                _kill_tree(proc.pid)
            outputs[node] = outputs.get(node) or proc.communicate()[0]
    assert procs["A"].returncode == 0, outputs["A"] + "\nnode B:\n" + outputs["B"]
    assert took < 40, f"took {took:.0f} s:\n{outputs['A']}"
    stopped = [line for line in outputs["A"].splitlines() if line.startswith("fw: stopped by the loss of node 1's launcher")]
    assert stopped and "checkpoint" in stopped[0], outputs["A"] + "\nnode B:\n" + outputs["B"]
    assert (tmp_path / "preempted.ckpt").is_file()
