"""``RayTrainEnvironment``: a worker of Ray Train's ``TorchTrainer``.

Before it runs ``train_loop_per_worker``, Ray Train's torch backend sets, in every worker:
``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``NODE_RANK``, ``MASTER_ADDR`` and
``MASTER_PORT`` (torchrun's names, less ``GROUP_RANK``/``GROUP_WORLD_SIZE``), and it has already
made the default process group (Gloo on CPUs, NCCL on GPUs). Every process that a Ray node
starts carries ``RAY_RAYLET_PID``, which tells such a worker from torchrun's.

The strategy finds the group made and uses it (``DistributedStrategy``: a group it did not make
is left as it was found, for Ray to destroy). How many nodes the workers span, and how many a
node holds, are Ray's choice (placement groups, elastic resizes): the job's shape is taken from
Ray, and ``trainer.num_nodes`` need not be set.

The variables do not say how many nodes there are, and with uneven placement (3 workers on one
node, 1 on another) no rank can tell from its own: the count is that of the distinct node
addresses of the workers' placement group (Ray's ``NODE_RANK`` numbers the same addresses), the
same on every rank; where Ray cannot be asked (no ray in this process), ``num_nodes`` is this
rank's estimate, for display only, and ``check`` refuses any ``trainer.num_nodes`` but 1 alike
on every rank.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from typing import Any

from framework.environments.base import ClusterEnvironment, env_int, env_str, require_int
from framework.environments.info import DistInfo
from framework.errors import ConfigError


class RayTrainEnvironment(ClusterEnvironment):
    """Reads the variables Ray Train sets in a ``TorchTrainer``'s workers."""

    name = "ray"
    _placement_nodes: int | None  # set by _nodes_of_placement, once

    @staticmethod
    def detect(env: Mapping[str, str]) -> bool:
        # torchrun started inside a Ray task sets TORCHELASTIC_RUN_ID: then its ranks count
        return ("RAY_RAYLET_PID" in env and "RANK" in env and "WORLD_SIZE" in env
                and "TORCHELASTIC_RUN_ID" not in env)

    def info(self) -> DistInfo:
        env = self.env
        rank = require_int(env, self.name, "RANK")
        world_size = require_int(env, self.name, "WORLD_SIZE")
        local_world_size = env_int(env, "LOCAL_WORLD_SIZE", default=world_size)
        local_rank = env_int(env, "LOCAL_RANK", default=rank % max(local_world_size, 1))
        node_rank = env_int(env, "NODE_RANK", default=0)
        num_nodes = self._nodes_of_placement()
        if num_nodes is None:
            # Ray may place more workers on one node than on another: the count of nodes is at least
            # this node's index + 1, and as many as the workers fill at this node's size (an
            # estimate that can differ between ranks: see check)
            num_nodes = max(node_rank + 1, math.ceil(world_size / max(local_world_size, 1)))
        return DistInfo(
            rank=rank,
            local_rank=local_rank,
            world_size=world_size,
            local_world_size=local_world_size,
            node_rank=node_rank,
            num_nodes=min(num_nodes, world_size),
            master_addr=env_str(env, "MASTER_ADDR", default="127.0.0.1"),
            master_port=env_int(env, "MASTER_PORT"),
            source=self.name,
        )

    def check(self, devices: int, num_nodes: int) -> None:
        """Ray chose the workers (``ScalingConfig(num_workers=...)``): ``trainer.devices`` must be
        this node's share of them (``auto`` is), and ``trainer.num_nodes`` is Ray's to choose: 1
        (the default), or the nodes of Ray's placement where Ray says how many (never this rank's
        estimate: every rank accepts or refuses alike).

        Raises:
            ConfigError: ``trainer.devices`` or ``trainer.num_nodes`` names another shape.
        """
        info = self.info()
        nodes = self._nodes_of_placement()  # the same on every rank, unlike info's estimate
        if devices != info.local_world_size:
            raise ConfigError(
                f"Ray Train started {info.local_world_size} worker(s) on this node but trainer.devices={devices}. "
                "HINT: leave trainer.devices at 'auto' under Ray (the workers are ScalingConfig(num_workers=...))"
            )
        if num_nodes != 1 and num_nodes != nodes:
            raise ConfigError(
                f"trainer.num_nodes={num_nodes}, but Ray Train placed its {info.world_size} worker(s) itself"
                f"{f' on {nodes} node(s)' if nodes else ''}. "
                "HINT: leave trainer.num_nodes at 1 under Ray (ScalingConfig(num_workers=...) sets the job's size)"
            )

    def _nodes_of_placement(self) -> int | None:
        """How many nodes Ray placed the workers on: the distinct addresses of the nodes that hold
        the bundles of this worker's placement group (the same on every rank), asked of Ray once;
        None where Ray cannot be asked (ray not imported or not started in this process)."""
        if not hasattr(self, "_placement_nodes"):
            self._placement_nodes = _count_placement_nodes(sys.modules.get("ray"))
        return self._placement_nodes


def _count_placement_nodes(ray: Any) -> int | None:
    """The number of distinct node addresses of the current placement group's bundles (Ray Train
    makes one bundle per worker), or None. Ray is never imported or started here: a Ray worker has
    imported it already."""
    try:
        if ray is None or not ray.is_initialized():
            return None
        group = ray.util.get_current_placement_group()
        if group is None:
            return None
        node_ids = set(ray.util.placement_group_table(group).get("bundles_to_node_id", {}).values())
        addresses = {node["NodeID"]: node.get("NodeManagerAddress") for node in ray.nodes()}
    except Exception:  # an older or newer Ray's shape, a GCS that does not answer: not counted
        return None
    return len({addresses.get(node_id) or node_id for node_id in node_ids}) or None
