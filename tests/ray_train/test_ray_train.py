"""fw inside Ray Train's ``TorchTrainer``, for real: 2 workers over Gloo on a Ray cluster of this machine.

One cluster for the module (``ray.cluster_utils.Cluster``: a head node and a second node of 1 CPU
each, so that a test can take a node away, as a cloud takes a machine), shut down in ``finally``.
Ray's session files go to a temporary folder, each run's storage to the test's ``tmp_path``; no
working directory is uploaded (the workers import this checkout's ``framework`` from the
``PYTHONPATH`` the cluster is given, and this folder's ``workload`` travels by value).

- the same final weights, bit for bit, as the same fit under fw's own launcher (``devices=2``),
  with Ray's process group used (not a second one) and left to Ray: this uninterrupted run is also
  the reference of the next test;
- one elastic run (``ScalingConfig(num_workers=(1, 2))``, ``FailureConfig(max_failures=2)``) that
  loses a worker twice: rank 1 killed by SIGKILL mid-epoch (step 5), Ray restarts the group with 2
  workers and fw resumes from the last checkpoint it reported: the checkpoints it reports next
  equal the uninterrupted run's bit for bit; then a node goes away in the second epoch (step 9),
  the group comes back with 1 worker, resumes from the last report and ends within 1e-5
  of the run never stopped (``resume-other-ranks.md``'s bound). One run for both saves a group's
  start and a node's;
- a user error in a worker reaches the driver as fw's own one-line error (``framework.ray.fit``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import torch
from distributed.helpers import REPO, check_ok, run_script

from . import workload

# ray is imported by the fixtures only: collecting this module (every pytest worker does) costs no import of it
pytestmark = [pytest.mark.procs,
              pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                                 reason="ray[train] is not installed (pip install 'fw[ray]')")]

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def cluster():
    """A Ray cluster of two 1-CPU nodes on this machine: ``{"cluster": ..., "node": the second node}``."""
    import ray
    import ray.cloudpickle
    from ray.cluster_utils import Cluster

    temp = tempfile.mkdtemp(prefix="fw-ray-")  # Ray's sockets and logs: a short path outside the repository
    made = None
    try:
        made = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                             "temp_dir": temp})
        node = made.add_node(num_cpus=1)
        ray.init(address=made.address, logging_level="warning",
                 runtime_env={"env_vars": {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}})
        ray.cloudpickle.register_pickle_by_value(workload)
        yield {"cluster": made, "node": node}
    finally:
        ray.shutdown()
        if made is not None:
            made.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


def both_nodes(cluster: dict) -> dict:
    """The module's cluster with its two nodes: the second one added again if a test took it away
    (the elastic test, the module's last in file order, needs no node back after it)."""
    if cluster["node"] is None:
        handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
        cluster["node"] = cluster["cluster"].add_node(num_cpus=1)
        for sig, handler in handlers.items():  # a node started here sets its own, for good
            signal.signal(sig, handler)
    return cluster


def fit_on_ray(folder: Path, name: str, workers, max_failures: int = 0, **config):
    """One ``TorchTrainer`` run of ``workload.train_loop``: its ``ray.train.Result``."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    import framework.ray

    folder.mkdir(parents=True, exist_ok=True)
    # Ray's controller polls the workers every 2 s by default, and reports wait for its polls; its
    # preemption watcher (one more process each run) has no preemption to watch here. These
    # variables go from the driver's environment to the controller when fit starts
    speed = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2", "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0"}
    os.environ.update(speed)
    trainer = TorchTrainer(
        workload.train_loop, train_loop_config={"folder": str(folder), **config},
        scaling_config=ScalingConfig(num_workers=workers),
        run_config=RunConfig(storage_path=str(folder / "storage"), name=name,
                             failure_config=FailureConfig(max_failures=max_failures)))
    try:
        return framework.ray.fit(trainer)
    finally:
        for key in speed:
            del os.environ[key]


def final_weights(result) -> dict[str, torch.Tensor]:
    """The weights in the last checkpoint the run reported to Ray (in its storage_path)."""
    path = Path(result.checkpoint.path) / "checkpoint.ckpt"
    return torch.load(path, weights_only=True)["state_dict"]


def reported(folder: Path, name: str) -> dict[int, dict[str, torch.Tensor]]:
    """The weights of every checkpoint a run reported to Ray, by global step."""
    found = {}
    for path in (folder / "storage" / name).glob("checkpoint_*/checkpoint.ckpt"):
        checkpoint = torch.load(path, weights_only=True)
        found[checkpoint["global_step"]] = checkpoint["state_dict"]
    return found


def attempts(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "attempts.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def uninterrupted(cluster, tmp_path_factory):
    """2 Ray workers, never stopped: the reference of the restarts (its folder, its result)."""
    both_nodes(cluster)
    folder = tmp_path_factory.mktemp("uninterrupted")
    return folder, fit_on_ray(folder, "uninterrupted", workers=2)


@pytest.mark.timeout(300)
def test_same_weights_as_fws_own_launcher(uninterrupted, tmp_path):
    folder, result = uninterrupted
    [first] = attempts(folder)
    # fw saw Ray's workers and took the process group Ray had made, and left it to Ray
    assert first == {"world": 2, "start_step": 0, "environment": "ray", "strategy": "ddp_gloo",
                     "group_before": True, "backend": "gloo", "nodes_of_placement": 1}
    assert [p.read_text() for p in folder.glob("group_after_attempt_*")] == ["True"]
    # Ray holds the metrics and checkpoints fw reported: every 2 steps, the last at the end
    steps = 2 * 96 // workload.GLOBAL_BATCH
    assert result.metrics["step"] == steps and result.metrics["epoch"] == 1
    assert "train/loss" in result.metrics
    stored = sorted((folder / "storage" / "uninterrupted").glob("checkpoint_*/checkpoint.ckpt"))
    assert len(stored) == steps // workload.REPORT_EVERY
    # the same fit under fw's own launcher ends with the same weights, bit for bit
    shutil.copy(HERE / "workload.py", tmp_path / "workload.py")
    check_ok(run_script(tmp_path / "workload.py", str(tmp_path / "launcher.pt"), timeout=120))
    reference = torch.load(tmp_path / "launcher.pt", weights_only=True)
    weights = final_weights(result)
    assert weights.keys() == reference.keys()
    for key, value in reference.items():
        assert torch.equal(weights[key], value), key


@pytest.mark.timeout(240)
def test_a_user_error_in_a_worker_is_one_line_on_the_driver(cluster, tmp_path):
    from framework.errors import ConfigError

    both_nodes(cluster)
    with pytest.raises(ConfigError) as caught:
        fit_on_ray(tmp_path, "bad", workers=2, bad_argument=True)
    message = str(caught.value)
    assert message == "trainer.gradient_clip_algorithm 'sideways': use norm or value"
    if sys.version_info >= (3, 11):  # both ranks raise it; Ray may stop the group before rank 1's reaches it
        [note] = caught.value.__notes__
        assert note in ("(raised in Ray Train worker ranks 0,1; the traceback is in Ray's log above)",
                        "(raised in Ray Train worker rank 0; the traceback is in Ray's log above)"), note


@pytest.mark.timeout(420)
def test_a_killed_worker_then_a_lost_node_resume_exactly(cluster, uninterrupted, tmp_path, monkeypatch):
    made, node = both_nodes(cluster)["cluster"], cluster["node"]
    # Ray first tries the old size again, until this timeout (60 s by default)
    monkeypatch.setenv("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "10")
    marker = tmp_path / "hold"
    taken = threading.Event()

    def take_the_node_away() -> None:
        deadline = time.monotonic() + 300
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        if marker.exists():
            made.remove_node(node)  # its raylet and the worker on it die
            cluster["node"] = None  # a later test that needs it adds it again (both_nodes)
            taken.set()
            Path(str(marker) + ".done").touch()

    watcher = threading.Thread(target=take_the_node_away, daemon=True)
    watcher.start()
    try:
        result = fit_on_ray(tmp_path, "elastic", workers=(1, 2), max_failures=2, kill_at=5, hold_at=9)
    finally:
        marker.touch()  # the watcher ends
        watcher.join(timeout=60)
    assert (tmp_path / "killed").exists() and taken.is_set()  # rank 1 did die by SIGKILL, then a node went
    first, second, third = attempts(tmp_path)
    assert (first["world"], first["start_step"]) == (2, 0)
    # the restarted group resumed mid-epoch from a checkpoint reported before the kill (Ray registers
    # a report once its controller polled every worker: the one just before the kill may be lost),
    # and what it reported until the node went equals the uninterrupted run's reports bit for bit
    assert second["world"] == 2 and 0 < second["start_step"] < 5 and second["start_step"] % workload.REPORT_EVERY == 0
    # the group that came back smaller resumed from a report of the restarted group
    assert third["world"] == 1 and second["start_step"] < third["start_step"] <= 9
    reference, got = reported(uninterrupted[0], "uninterrupted"), reported(tmp_path, "elastic")
    after_the_kill = [step for step in sorted(got) if second["start_step"] < step <= third["start_step"]]
    assert after_the_kill, sorted(got)
    for step in after_the_kill:
        for key, value in reference[step].items():
            assert torch.equal(got[step][key], value), (step, key)
    weights, final = final_weights(result), final_weights(uninterrupted[1])
    gap = max((weights[k] - final[k]).abs().max().item() for k in final)
    assert gap < 1e-5, gap
