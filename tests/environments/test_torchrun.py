"""TorchElasticEnvironment: torchrun and torch.distributed.launch variables."""

from __future__ import annotations

import pytest

from framework.environments import DistInfo, TorchElasticEnvironment
from framework.environments.torchrun import local_rank_from_argv
from framework.errors import DistributedSetupError

TORCHRUN_2x2 = {
    "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "MASTER_ADDR": "node01",
    "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "abc",
}


def test_detect() -> None:
    assert TorchElasticEnvironment.detect({"RANK": "0", "WORLD_SIZE": "1"})
    assert TorchElasticEnvironment.detect({"TORCHELASTIC_RUN_ID": "x"})
    assert not TorchElasticEnvironment.detect({"RANK": "0"})
    assert not TorchElasticEnvironment.detect({})


def test_two_nodes_of_two() -> None:
    environment = TorchElasticEnvironment(env=TORCHRUN_2x2, argv=[])
    assert environment.launched_externally
    assert environment.info() == DistInfo(
        rank=3, local_rank=1, world_size=4, local_world_size=2, node_rank=1, num_nodes=2,
        master_addr="node01", master_port=29500, source="torchrun",
    )


def test_num_nodes_from_local_world_size() -> None:
    env = {k: v for k, v in TORCHRUN_2x2.items() if k != "GROUP_WORLD_SIZE"}
    assert TorchElasticEnvironment(env=env, argv=[]).info().num_nodes == 2


def test_not_divisible_world_is_an_error() -> None:
    env = {"RANK": "0", "WORLD_SIZE": "3", "LOCAL_WORLD_SIZE": "2"}
    with pytest.raises(DistributedSetupError, match="not a multiple"):
        TorchElasticEnvironment(env=env, argv=[]).info()


def test_defaults_without_master_and_local_variables() -> None:
    info = TorchElasticEnvironment(env={"RANK": "1", "WORLD_SIZE": "2"}, argv=[]).info()
    assert (info.local_rank, info.local_world_size, info.num_nodes) == (1, 2, 1)
    assert (info.master_addr, info.master_port) == ("127.0.0.1", None)


@pytest.mark.parametrize(
    "argv",
    [
        ["train.py", "--local_rank=1"],
        ["train.py", "--local-rank=1"],
        ["train.py", "--local_rank", "1"],
        ["train.py", "--local-rank", "1", "--other"],
    ],
)
def test_local_rank_from_argv(argv: list[str]) -> None:
    assert local_rank_from_argv(argv) == 1
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1234"}
    assert TorchElasticEnvironment(env=env, argv=argv).info().local_rank == 1


def test_env_local_rank_wins_over_argv() -> None:
    env = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}
    assert TorchElasticEnvironment(env=env, argv=["--local_rank=1"]).info().local_rank == 0


def test_argv_without_flag() -> None:
    assert local_rank_from_argv(["train.py", "--local_ranks=3"]) is None


@pytest.mark.parametrize("argv", [["--local_rank=x"], ["--local_rank"]])
def test_bad_local_rank_argument(argv: list[str]) -> None:
    with pytest.raises(DistributedSetupError, match="--local_rank"):
        local_rank_from_argv(argv)


def test_non_integer_variable() -> None:
    with pytest.raises(DistributedSetupError, match="RANK='zero'"):
        TorchElasticEnvironment(env={"RANK": "zero", "WORLD_SIZE": "2"}, argv=[]).info()


def test_rank_outside_world() -> None:
    with pytest.raises(DistributedSetupError, match="rank=2"):
        TorchElasticEnvironment(env={"RANK": "2", "WORLD_SIZE": "2"}, argv=[]).info()
