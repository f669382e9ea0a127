"""LocalEnvironment and the DistInfo invariants."""

from __future__ import annotations

import dataclasses

import pytest

from framework.environments import DistInfo, LocalEnvironment
from framework.errors import DistributedSetupError


def test_local_is_rank_zero_of_one() -> None:
    environment = LocalEnvironment(env={}, argv=[])
    assert LocalEnvironment.detect({})
    assert environment.info() == DistInfo(source="local")
    assert not environment.info().is_distributed
    assert environment.launched_externally is False


def test_distinfo_is_frozen() -> None:
    info = DistInfo()
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.rank = 1  # type: ignore[misc]


def test_distinfo_is_distributed() -> None:
    info = DistInfo(rank=1, world_size=2, local_world_size=2, local_rank=1)
    assert info.is_distributed


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rank": 2, "world_size": 2, "local_world_size": 2}, "rank=2"),
        ({"rank": -1}, "rank=-1"),
        ({"world_size": 0}, "world_size=0"),
        ({"local_rank": 1}, "local_rank=1"),
        ({"local_world_size": 3, "world_size": 2}, "local_world_size=3"),
        ({"node_rank": 1}, "node_rank=1"),
        ({"num_nodes": 3, "world_size": 2, "local_world_size": 1}, "num_nodes=3"),
        ({"master_port": 70000}, "master_port=70000"),
        ({"master_addr": ""}, "master_addr"),
    ],
)
def test_distinfo_rejects_inconsistent_values(kwargs: dict, message: str) -> None:
    with pytest.raises(DistributedSetupError, match=message):
        DistInfo(**kwargs)
