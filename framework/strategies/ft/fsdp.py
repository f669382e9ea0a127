"""``trainer.strategy=ft_fsdp``: one replica group of a fault-tolerant job with FSDP inside it.

As torchtitan's torchft integration builds HSDP: inside the group the parameters, gradients and
optimizer state are sharded by FSDP2 (``fully_shard`` over the group's ranks; the backward
reduce-scatters inside the group), and across the groups each rank's local gradient shard is
averaged with the same rank's of the other groups through torchft's Manager, whose process group
joins rank r of every group (``replicas.py``). Every group must have the same shape, so that rank
r's shards cover the same slices everywhere: a group that heals from a peer of another size is
refused in one line (the state sent says the sender's size), and the shape (ranks in the group,
elements of this rank's shards, sharded or not) is part of what the groups agree on at each
commit (``ReplicaGroup._group_shape``), so groups resumed from checkpoints are checked too. The
other group's rank r with no counterpart fails its step (torchft's error), which is not committed.

What ``ft`` does holds here too (``strategy.py``'s ``ReplicaGroup``): the quorum, the commit and
its agreement, the buffers averaged (first inside the group, as FSDP keeps them per rank, then
over the groups), the untrained record, the checkpoint written by one group. A restarted group
heals rank by rank: rank r receives rank r's pieces of a live peer's state, its DTensors sent as
their local shards (``_Shard``: the local tensor, the global shape and stride, the placements)
and made DTensors again on this group's mesh. Checkpoints are FSDP's (``sharded`` or ``full``),
read back by ``ckpt_path`` by every group (tested on groups of the size that wrote it; DCP would
reshard the tensors for another size, which is not tested); the data position is taken as ``ft``
takes it, rank r of the group from rank r's entry.

``HYBRID_SHARD`` is refused: the replica groups are the replicated dimension.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from framework.checkpointing.parts import CheckpointParts
from framework.errors import ConfigError
from framework.strategies.distributed import DEFAULT_TIMEOUT_S
from framework.strategies.fsdp import FSDPStrategy
from framework.strategies.ft.strategy import ReplicaGroup


class FaultTolerantFSDPStrategy(ReplicaGroup, FSDPStrategy):
    """FSDP inside a replica group, torchft's Manager across the groups (HSDP across groups).

    Args:
        replica_id, num_replica_groups, lighthouse, min_replicas, quorum_timeout,
            lighthouse_wait, start_alone: ``ft``'s (``FaultTolerantStrategy``).
        auto_wrap_policy, sharding_strategy, state_dict_type, async_save, cpu_offload,
            activation_checkpointing_policy: ``fsdp``'s inside the group; ``sharding_strategy``
            is ``FULL_SHARD`` or ``SHARD_GRAD_OP`` (the groups are the replicas).
        backend, init_method, timeout, socket_ifname: as for ``fsdp``; ``timeout`` is also the
            cross-replica all-reduce's and a fresh job's wait for every group.
    """

    #: FSDP keeps a buffer per rank: ``replicas.py`` averages buffers inside the group first
    buffers_per_rank = True

    def __init__(
        self,
        replica_id: int | None = None,
        num_replica_groups: int | None = None,
        lighthouse: str | None = None,
        min_replicas: int = 1,
        quorum_timeout: float | None = None,
        lighthouse_wait: float = 30.0,
        start_alone: bool = False,
        auto_wrap_policy: Iterable[type[nn.Module] | str] | None = None,
        sharding_strategy: str = "FULL_SHARD",
        state_dict_type: str = "sharded",
        async_save: bool = False,
        cpu_offload: bool = False,
        activation_checkpointing_policy: Iterable[type[nn.Module] | str] | None = None,
        backend: str = "gloo",
        init_method: str = "env://",
        timeout: float = DEFAULT_TIMEOUT_S,
        socket_ifname: str | None = None,
    ) -> None:
        if str(sharding_strategy).upper() == "HYBRID_SHARD":
            raise ConfigError("trainer.strategy.sharding_strategy=HYBRID_SHARD with strategy ft_fsdp: the replica "
                              "groups are the replicated dimension already; use FULL_SHARD or SHARD_GRAD_OP")
        FSDPStrategy.__init__(self, auto_wrap_policy, sharding_strategy, None, state_dict_type, async_save,
                              cpu_offload, activation_checkpointing_policy, backend, init_method, timeout,
                              socket_ifname)
        self._init_replica_group("ft_fsdp", replica_id, num_replica_groups, lighthouse, min_replicas,
                                 quorum_timeout, lighthouse_wait, start_alone, timeout)
        self._group_ranks_only = False  # while a checkpoint is read: the group's data ranks (``_load_file``)

    def distributed_sampler_kwargs(self) -> dict[str, int] | None:
        if self._group_ranks_only:
            return FSDPStrategy.distributed_sampler_kwargs(self)
        return ReplicaGroup.distributed_sampler_kwargs(self)

    def join_replicas(self, save: Callable[[], dict], load_in_place: Callable[[dict], None], global_step: int,
                      manual: bool, on_nonfinite: str, facts: Callable[[], dict[str, float]] = dict,
                      folders: Callable[[], list[str]] = list) -> str | None:
        """``ft``'s join, with this rank's DTensors sent as their local shards and made DTensors
        again where a peer's state is received."""
        def send() -> dict:
            return {**_to_shards(save()), _GROUP: {"ranks": self.world_size}}

        peer = super().join_replicas(send, lambda state: load_in_place(self._from_shards(state)), global_step, manual,
                                     on_nonfinite, facts, folders)
        if self._received is not None:
            self._received = self._from_shards(self._received)
        return peer

    def _load_file(self, path: str, parts: CheckpointParts) -> dict[str, Any]:
        """FSDP's sharded or full checkpoint; rank r of the group takes rank r's data position."""
        with self._group_data_ranks():
            return FSDPStrategy.load_checkpoint(self, path, parts)

    @contextlib.contextmanager
    def _group_data_ranks(self) -> Iterator[None]:
        self._group_ranks_only = True
        try:
            yield
        finally:
            self._group_ranks_only = False

    def _from_shards(self, state: dict) -> dict:
        """``state`` with every ``_Shard`` a DTensor on this group's mesh again; a peer's group of
        another size (its rank r's shards are other slices) is refused."""
        from torch.distributed.tensor import DTensor
        from torch.utils._pytree import tree_map

        state = dict(state)
        theirs = int((state.pop(_GROUP, None) or {}).get("ranks", -1))
        if theirs != self.world_size:
            raise ConfigError(f"replica {self.replica_id} has {self.world_size} rank(s) in its group and the live peer "
                              f"it heals from has {theirs}: under ft_fsdp rank r's shards line up with rank r's of "
                              "the other groups only if every group has the same number of ranks (trainer.devices x "
                              "trainer.num_nodes)")
        assert self.model is not None, "setup_module() first"
        mesh = next(p.device_mesh for p in self.model.parameters() if isinstance(p, DTensor))

        def back(value: Any) -> Any:
            if not isinstance(value, _Shard):
                return value
            local = value.local.to(mesh.device_type)
            return DTensor.from_local(local, mesh, value.placements, run_check=False, shape=value.shape,
                                      stride=value.stride)

        return tree_map(back, state)


#: the entry of a state sent to a healing peer that says the sender's group size
_GROUP = "fw/ft_fsdp_group"


@dataclass(frozen=True)
class _Shard:
    """A DTensor as a healing peer receives it: this rank's local shard and where it sits."""

    local: torch.Tensor
    shape: torch.Size
    stride: tuple[int, ...]
    placements: tuple[Any, ...]


def _to_shards(state: Any) -> Any:
    """``state`` with every DTensor replaced by a copy of its local shard in CPU memory (no
    collective; a copy, as ``Replicas._state`` copies the rest: torchft serves it while this
    replica trains on)."""
    from torch.distributed.tensor import DTensor
    from torch.utils._pytree import tree_map

    def local(value: Any) -> Any:
        if not isinstance(value, DTensor):
            return value
        value = value.detach()
        return _Shard(value.to_local().to("cpu", copy=True), value.shape, tuple(value.stride()), tuple(value.placements))

    return tree_map(local, state)
