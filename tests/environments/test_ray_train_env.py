"""``RayTrainEnvironment``: a Ray Train worker is recognised from the variables Ray sets, and its shape is Ray's."""

from __future__ import annotations

import sys
import types

import pytest

from framework.environments import DistInfo, RayTrainEnvironment, TorchElasticEnvironment, detect_environment
from framework.errors import ConfigError

#: what Ray Train 2.x's torch backend sets in worker 1 of 2 on one node (as seen in a worker)
RAY_WORKER = {"RAY_RAYLET_PID": "32622", "RAY_JOB_ID": "01000000", "MASTER_ADDR": "192.0.2.2",
              "MASTER_PORT": "39171", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "NODE_RANK": "0",
              "RANK": "1", "WORLD_SIZE": "2"}


def test_a_ray_train_worker_is_detected_before_torchrun():
    env = detect_environment(RAY_WORKER, argv=[])
    assert isinstance(env, RayTrainEnvironment) and env.launched_externally
    assert env.info() == DistInfo(rank=1, local_rank=1, world_size=2, local_world_size=2, node_rank=0, num_nodes=1,
                                  master_addr="192.0.2.2", master_port=39171, source="ray")


def test_torchrun_inside_ray_and_a_plain_torchrun_stay_torchrun():
    assert isinstance(detect_environment({**RAY_WORKER, "TORCHELASTIC_RUN_ID": "x"}, argv=[]), TorchElasticEnvironment)
    plain = {k: v for k, v in RAY_WORKER.items() if not k.startswith("RAY_")}
    assert isinstance(detect_environment(plain, argv=[]), TorchElasticEnvironment)
    # a process of a Ray node that is no Train worker (no ranks) is not Ray Train's
    assert detect_environment({"RAY_RAYLET_PID": "1"}, argv=[]).name == "local"


def test_workers_spread_unevenly_over_nodes():
    # 3 workers: 2 on node 0, 1 on node 1 (Ray's placement); this is the one on node 1
    env = RayTrainEnvironment({**RAY_WORKER, "RANK": "2", "WORLD_SIZE": "3", "LOCAL_RANK": "0",
                               "LOCAL_WORLD_SIZE": "1", "NODE_RANK": "1"})
    info = env.info()
    assert (info.rank, info.local_rank, info.node_rank, info.local_world_size) == (2, 0, 1, 1)
    assert 2 <= info.num_nodes <= 3  # the variables do not say how many nodes: at least this one's index + 1
    env.check(devices=1, num_nodes=1)  # trainer.num_nodes left at 1: Ray's placement is taken as it is


def _uneven():
    """The two kinds of rank of 4 workers placed 3 on one node, 1 on another (Ray's NODE_RANK
    numbers the nodes' addresses)."""
    return [RayTrainEnvironment({**RAY_WORKER, "RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "0",
                                  "LOCAL_WORLD_SIZE": "3", "NODE_RANK": "0"}),
             RayTrainEnvironment({**RAY_WORKER, "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "0",
                                  "LOCAL_WORLD_SIZE": "1", "NODE_RANK": "1"})]


class _Ray:
    """``ray`` in a worker: its placement group's bundles on nodes a, a, a, b (two addresses)."""

    def __init__(self):
        group = object()
        self.util = types.SimpleNamespace(
            get_current_placement_group=lambda: group,
            placement_group_table=lambda pg: {"bundles_to_node_id": {0: "a", 1: "a", 2: "a", 3: "b"}} if pg is group else {})

    def is_initialized(self):
        return True

    def nodes(self):
        return [{"NodeID": "a", "NodeManagerAddress": "10.0.0.1"}, {"NodeID": "b", "NodeManagerAddress": "10.0.0.2"},
                {"NodeID": "c", "NodeManagerAddress": "10.0.0.3"}]


def test_every_rank_counts_the_nodes_alike_under_uneven_placement(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", _Ray())
    ranks = _uneven()
    assert [env.info().num_nodes for env in ranks] == [2, 2]  # from Ray's placement group, not this rank's share
    for env in ranks:
        env.check(devices=env.info().local_world_size, num_nodes=2)
        with pytest.raises(ConfigError, match=r"trainer.num_nodes=4, but Ray Train placed its 4 worker\(s\) itself "
                                              r"on 2 node\(s\)"):
            env.check(devices=env.info().local_world_size, num_nodes=4)


def test_without_rays_count_only_num_nodes_1_is_taken_on_every_rank(monkeypatch):
    monkeypatch.delitem(sys.modules, "ray", raising=False)  # Ray cannot be asked: each rank's estimate differs
    ranks = _uneven()
    for env in ranks:
        env.check(devices=env.info().local_world_size, num_nodes=1)
        with pytest.raises(ConfigError, match=r"trainer.num_nodes=2.*HINT: leave trainer.num_nodes at 1 under Ray"):
            env.check(devices=env.info().local_world_size, num_nodes=2)


def test_a_trainer_shape_other_than_rays_is_refused_with_the_fix():
    env = RayTrainEnvironment(RAY_WORKER)
    env.check(devices=2, num_nodes=1)
    with pytest.raises(ConfigError, match=r"Ray Train started 2 worker\(s\) on this node but trainer.devices=4. "
                                          r"HINT: leave trainer.devices at 'auto'"):
        env.check(devices=4, num_nodes=1)
    with pytest.raises(ConfigError, match=r"trainer.num_nodes=3.*HINT: leave trainer.num_nodes at 1 under Ray"):
        env.check(devices=2, num_nodes=3)
