"""``RayTrainEnvironment``: a Ray Train worker is recognised from the variables Ray sets, and its shape is Ray's."""

from __future__ import annotations

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
    assert 2 <= info.num_nodes <= 3  # Ray does not say how many nodes: at least this one's index + 1
    env.check(devices=1, num_nodes=1)  # trainer.num_nodes left at 1: Ray's placement is taken as it is


def test_a_trainer_shape_other_than_rays_is_refused_with_the_fix():
    env = RayTrainEnvironment(RAY_WORKER)
    env.check(devices=2, num_nodes=1)
    with pytest.raises(ConfigError, match=r"Ray Train started 2 worker\(s\) on this node but trainer.devices=4. "
                                          r"HINT: leave trainer.devices at 'auto'"):
        env.check(devices=4, num_nodes=1)
    with pytest.raises(ConfigError, match=r"trainer.num_nodes=3.*HINT: leave trainer.num_nodes at 1 under Ray"):
        env.check(devices=2, num_nodes=3)
