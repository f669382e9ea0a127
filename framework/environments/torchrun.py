"""``TorchElasticEnvironment``: processes started by ``torchrun`` (``torch.distributed.run``).

torchrun sets, in every worker: ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``,
``GROUP_RANK`` (the node rank), ``GROUP_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` and
``TORCHELASTIC_RUN_ID``. The older ``python -m torch.distributed.launch`` (without
``--use-env``) sets ``RANK``/``WORLD_SIZE``/``MASTER_*`` but passes the local rank on the
command line instead (``--local_rank=N``, or ``--local-rank=N`` since torch 2.0), so that form is
read from ``argv`` when ``LOCAL_RANK`` is missing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from framework.environments.base import ClusterEnvironment, env_int, env_str, require_int
from framework.environments.info import DistInfo
from framework.errors import DistributedSetupError

_LOCAL_RANK_FLAGS = ("--local_rank", "--local-rank")


def local_rank_from_argv(argv: Sequence[str]) -> int | None:
    """Return N from ``--local_rank=N``, ``--local-rank=N`` or ``--local_rank N`` in ``argv``.

    Raises:
        DistributedSetupError: the flag is there but its value is missing or not an integer.
    """
    args = list(argv)
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if flag not in _LOCAL_RANK_FLAGS:
            continue
        if not eq:
            value = args[i + 1] if i + 1 < len(args) else ""
        try:
            return int(value)
        except ValueError:
            raise DistributedSetupError(
                f"{flag} on the command line needs an integer, got {value!r}"
            ) from None
    return None


class TorchElasticEnvironment(ClusterEnvironment):
    """Reads torchrun's (and ``torch.distributed.launch``'s) variables."""

    name = "torchrun"

    @staticmethod
    def detect(env: Mapping[str, str]) -> bool:
        return ("RANK" in env and "WORLD_SIZE" in env) or "TORCHELASTIC_RUN_ID" in env

    def info(self) -> DistInfo:
        env = self.env
        rank = require_int(env, self.name, "RANK")
        world_size = require_int(env, self.name, "WORLD_SIZE")
        group_world_size = env_int(env, "GROUP_WORLD_SIZE")
        default_local_size = world_size  # torch.distributed.launch on one node
        if group_world_size and world_size % group_world_size == 0:
            default_local_size = world_size // group_world_size
        local_world_size = env_int(env, "LOCAL_WORLD_SIZE", default=default_local_size)
        local_rank = env_int(env, "LOCAL_RANK")
        if local_rank is None:
            local_rank = local_rank_from_argv(self.argv)
        if local_rank is None:
            local_rank = rank % max(local_world_size, 1)
        node_rank = env_int(env, "GROUP_RANK", default=rank // max(local_world_size, 1))
        if group_world_size is not None:
            num_nodes = group_world_size
        elif local_world_size > 0 and world_size % local_world_size == 0:
            num_nodes = world_size // local_world_size
        else:
            raise DistributedSetupError(
                f"torchrun: WORLD_SIZE={world_size} is not a multiple of "
                f"LOCAL_WORLD_SIZE={local_world_size}; set GROUP_WORLD_SIZE"
            )
        return DistInfo(
            rank=rank,
            local_rank=local_rank,
            world_size=world_size,
            local_world_size=local_world_size,
            node_rank=node_rank,
            num_nodes=num_nodes,
            master_addr=env_str(env, "MASTER_ADDR", default="127.0.0.1"),
            master_port=env_int(env, "MASTER_PORT"),
            source=self.name,
        )
