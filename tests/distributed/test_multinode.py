"""Two "nodes" on one machine: two network namespaces joined by a veth pair, each with its own
interface and address. fw's own launcher runs one worker per node (``num_nodes=2``,
``devices=1``), the rendezvous at node A's address, Gloo on the named interface; the result
equals one process on the 2x batch. Needs root and iproute2 (CI has both); skips otherwise."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import torch

from . import workload
from .helpers import REPO, _kill_tree, clean_env, free_port, write_script

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


@pytest.fixture
def two_hosts():
    """Namespaces A and B, veth pair A 10.231.N.1 <-> B 10.231.N.2; removed afterwards."""
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


@pytest.mark.timeout(150)
def test_two_nodes_over_their_own_interfaces_equal_one_process(two_hosts, tmp_path):
    names, ifaces, addrs = two_hosts
    script = write_script(tmp_path, SCRIPT)
    endpoint = f"{addrs['A']}:{free_port()}"
    procs = {
        node: subprocess.Popen(
            ["ip", "netns", "exec", names[node], sys.executable, str(script), node, ifaces[node], endpoint,
             str(tmp_path)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=clean_env(), cwd=REPO,
            start_new_session=True)
        for node in "AB"
    }
    outputs = {}
    try:
        for node, proc in procs.items():
            outputs[node], _ = proc.communicate(timeout=120)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                _kill_tree(proc.pid)
                proc.communicate()
    for node, proc in procs.items():
        assert proc.returncode == 0, f"node {node}:\n{outputs.get(node)}"
    a = torch.load(tmp_path / "nodeA_rank0.pt")
    b = torch.load(tmp_path / "nodeB_rank1.pt")
    assert a["world_size"] == b["world_size"] == 2
    single = workload.fit_regressor("single", devices=1, batch_size=8, accumulate=1)
    for key, value in single["state"].items():
        assert torch.equal(a["state"][key], b["state"][key])
        torch.testing.assert_close(a["state"][key], value, atol=1e-5, rtol=0)
