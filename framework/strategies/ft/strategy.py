"""``trainer.strategy=ft``: one replica group of a job whose replica groups survive a lost one.

Each replica group is an ordinary fw job (one process, or several under fw's launcher or
torchrun with DDP inside the group), started on its own with its ``replica_id``. The groups meet
each step at a Lighthouse (``fw lighthouse``) through torchft's Manager (``replicas.py``): the
gradients, first averaged inside the group by DDP, are averaged over the groups present in the
step's quorum, and the step is applied only when it is committed. A group that is lost does not
stop the others; started again, it takes a live peer's state (weights, optimizer, progress, data
position) and trains on from there.

The data: each step's global batch is split over ``num_replica_groups`` x the group's ranks in
fw's global order (``distributed_sampler_kwargs``), so that the share of a missing replica is
named and recorded (``untrained.py``), never trained twice. Evaluation is sharded inside the
group: each replica validates on the whole validation set.

Checkpoints hold what a DDP checkpoint holds plus the ``fault_tolerance`` entry (the untrained
global batches, torchft's step count); only the replica with the lowest id in the last quorum
writes them. A full stop and ``ckpt_path=...`` resume as with ``ddp``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from framework.checkpointing import file as ckpt
from framework.checkpointing.parts import CheckpointParts, Value
from framework.errors import ConfigError, raised_alike_on_every_rank
from framework.rank_zero import rank_zero_info
from framework.strategies.ddp.strategy import DDPStrategy
from framework.strategies.distributed import DEFAULT_TIMEOUT_S
from framework.strategies.ft.lighthouse import import_torchft, lighthouse_address
from framework.strategies.ft.replicas import Replicas, local_shard
from framework.strategies.ft.untrained import Untrained

if TYPE_CHECKING:
    from torch import nn

    from framework.module import TrainModule

#: what ``load_checkpoint`` is given for the state a live peer sent at the join
PEER = "the state of replica {} (a live peer)"


class ReplicaGroup:
    """What makes a strategy one replica group of a fault-tolerant job, whatever runs inside the
    group (``FaultTolerantStrategy``: DDP; ``FaultTolerantFSDPStrategy``: FSDP, ``fsdp.py``).
    Mixed in before the group's strategy, whose collectives, checkpoints and model it uses; the
    subclass's ``__init__`` builds that strategy, then calls ``_init_replica_group``."""

    # the group's strategy's (declared for the type checker; the mixin defines none of them)
    name: str
    world_size: int
    global_rank: int
    timeout: float
    model: Any
    dist: Any
    broadcast: Callable[..., Any]

    def _init_replica_group(self, name: str, replica_id: int | None, num_replica_groups: int | None,
                            lighthouse: str | None, min_replicas: int, quorum_timeout: float | None,
                            lighthouse_wait: float, start_alone: bool, timeout: float) -> None:
        _check_ids(replica_id, num_replica_groups, min_replicas, name)
        import_torchft()  # a missing extra is said when the Trainer is built
        self.name = name
        assert replica_id is not None and num_replica_groups is not None, "checked by _check_ids"
        self.replica_id, self.num_replica_groups, self.min_replicas = int(replica_id), int(num_replica_groups), int(min_replicas)
        self.lighthouse = lighthouse_address(lighthouse)
        self.quorum_timeout = float(quorum_timeout if quorum_timeout is not None else timeout)
        self.lighthouse_wait = float(lighthouse_wait)
        self.start_alone = bool(start_alone)
        self.untrained = Untrained()
        self.replicas: Replicas | None = None
        self._manager_store: Any = None  # group rank 0's TCPStore for the Manager (replicas.py)
        self._manager_state: dict | None = None  # torchft's step count, from a checkpoint
        self._received: dict | None = None
        self._peer = ""

    # -- the data: a share of every global batch per group and rank ---------------------------
    def distributed_sampler_kwargs(self) -> dict[str, int] | None:
        """Training data: rank r of group g reads share ``g * ranks + r`` of each global batch."""
        return {"num_replicas": self.num_replica_groups * self.world_size,
                "rank": self.replica_id * self.world_size + self.global_rank}

    def evaluation_sampler_kwargs(self) -> dict[str, int] | None:
        """Evaluation inside the group: every replica's metrics cover the whole set."""
        return super().distributed_sampler_kwargs()  # type: ignore[misc]  # the group's strategy's

    def setup_module(self, module: TrainModule) -> nn.Module:
        trainer = getattr(module, "trainer", None)
        _refuse_scaled_precision(trainer.precision if trainer is not None else "32-true", self.name)
        return super().setup_module(module)  # type: ignore[misc]  # the group's strategy's

    def check_optimizers(self, optimizers: list[torch.optim.Optimizer]) -> None:
        if any(isinstance(opt, torch.optim.LBFGS) for opt in optimizers):
            raise ConfigError(f"trainer.strategy={self.name} cannot step LBFGS: its step computes new gradients that the "
                              "other replicas never see; use a first-order optimizer (SGD, Adam)")
        super().check_optimizers(optimizers)  # type: ignore[misc]  # the group's strategy's (fsdp: sharded parameters)

    # -- the replicas ---------------------------------------------------------------------
    def join_replicas(self, save: Callable[[], dict], load_in_place: Callable[[dict], None], global_step: int,
                      manual: bool, on_nonfinite: str, facts: Callable[[], dict[str, float]] = dict,
                      folders: Callable[[], list[str]] = list) -> str | None:
        """Meet the other replica groups (the first quorum). Returns what to restore from when a
        live peer sent its state (``load_checkpoint`` takes it), else None. ``facts``: the run's
        settings that every replica must share, compared at each commit; ``folders``: where
        this replica writes logs and checkpoints, which no other replica may share."""
        if manual:
            raise ConfigError(f"trainer.strategy={self.name} averages gradients across replicas in automatic optimization only; "
                              "a module with automatic_optimization = False would step without the other replicas")
        if on_nonfinite == "skip":
            raise ConfigError(f"trainer.on_nonfinite=skip cannot be agreed across replica groups under trainer.strategy={self.name} "
                              "(the other groups would average in a share that was dropped); use on_nonfinite=error, "
                              "which stops the group that met the bad loss while the others go on")
        def buffers() -> list[torch.Tensor]:
            return list(self.model.buffers()) if self.model is not None else []

        def shared() -> dict[str, float]:  # the run's settings and the group's shape (rank r meets rank r)
            return {**facts(), **self._group_shape()}

        self.replicas = Replicas(self, save, load_in_place, self.untrained, self._manager_state, shared, buffers,
                                 folders)
        received = self.replicas.join(self.timeout, global_step, self.start_alone)
        if received is None:
            return None
        self._received = received
        self._peer = PEER.format(self.replicas.ids[0] if self.replicas.ids else "?")
        return self._peer

    def _group_shape(self) -> dict[str, float]:
        """What must be the same in every group for rank r's gradients to line up with rank r's of
        the others: the ranks in the group, whether FSDP shards inside it, this rank's elements."""
        params = list(self.model.parameters()) if self.model is not None else []
        local = sum(local_shard(p).numel() for p in params)
        return {"number of ranks in a replica group": float(self.world_size),
                "sharding inside the group (fsdp)": float(getattr(self, "buffers_per_rank", False)),
                "number of parameter elements on this rank": float(local)}

    def writes_checkpoints(self) -> bool:
        return self.replicas is None or self.replicas.writes_checkpoints()

    def _fault_tolerance_part(self) -> Value:
        def saved() -> dict:
            manager = self.replicas.manager.state_dict() if self.replicas is not None else self._manager_state
            return {"untrained": self.untrained.state_dict(), "untrained_batches": self.untrained.batches,
                    "replica_groups": self.num_replica_groups, "manager": manager}

        def load(state: dict) -> None:
            self.untrained.load_state_dict(state.get("untrained") or [])
            self._manager_state = state.get("manager")
            if self.replicas is not None and self._manager_state is not None:
                self.replicas.manager.load_state_dict(self._manager_state)

        return Value(saved, load)

    # -- checkpoints ----------------------------------------------------------------------
    def save_checkpoint(self, path: str, parts: CheckpointParts) -> None:
        """One replica writes (the lowest id in the last quorum); the others write nothing."""
        if not self.writes_checkpoints():
            return
        parts.shared["fault_tolerance"] = self._fault_tolerance_part()
        super().save_checkpoint(path, parts)  # type: ignore[misc]  # the group's strategy's

    def load_checkpoint(self, path: str, parts: CheckpointParts) -> dict[str, Any]:
        """A checkpoint file, as ``ddp`` reads one (this group's rank r takes rank r's pieces), or
        the state a live peer sent at the join (its own rank's pieces)."""
        parts.shared["fault_tolerance"] = self._fault_tolerance_part()
        if path == self._peer and self._received is not None:
            checkpoint, self._received = self._received, None
            parts.load(checkpoint, 0, 1, (0, 1))
            rank_zero_info(f"fw: replica {self.replica_id} healed from {path} at step {checkpoint.get('global_step')}")
            return checkpoint
        return self._load_file(path, parts)

    def _load_file(self, path: str, parts: CheckpointParts) -> dict[str, Any]:
        """A checkpoint file or folder, this group's rank r taking rank r's pieces."""
        checkpoint = ckpt.load_checkpoint(path)
        parts.load(checkpoint, self.global_rank, self.world_size, (self.global_rank, self.world_size))
        return checkpoint

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "replica_id": self.replica_id,  # type: ignore[misc]
                "replica_groups": self.num_replica_groups, "lighthouse": self.lighthouse}

    def teardown(self) -> None:
        if self.replicas is not None:
            if self.untrained.entries:
                rank_zero_info(f"fw: replica {self.replica_id}: {self.untrained.describe()} were not trained "
                               "whole (kept in the checkpoints' fault_tolerance entry)")
            self.replicas.shutdown()
            self.replicas = None
        self._manager_store = None
        super().teardown()  # type: ignore[misc]


class FaultTolerantStrategy(ReplicaGroup, DDPStrategy):
    """DDP inside a replica group, torchft's Manager across the groups.

    Args:
        replica_id: this group's id, ``0 <= replica_id < num_replica_groups``.
        num_replica_groups: how many groups the job has when all are up (the global batch is
            split over all of them).
        lighthouse: the Lighthouse's address, ``http://HOST:PORT`` (default: ``TORCHFT_LIGHTHOUSE``).
        min_replicas: steps are committed only while at least this many groups are in the quorum.
        quorum_timeout: seconds a step waits for its quorum (a rejoining replica's set-up is
            waited for; default: ``timeout``).
        lighthouse_wait: seconds a replica waits at its start for the Lighthouse to answer before
            it refuses to start.
        start_alone: a replica group that finds no other at its start (after ``timeout``) and has
            no checkpoint begins alone, the others to heal from it later (default: refused).
        backend, init_method, timeout, socket_ifname, find_unused_parameters, bucket_cap_mb,
            static_graph, gradient_as_bucket_view: DDP's inside the group (``ddp_gloo``); ``timeout``
            is also the cross-replica all-reduce's and a fresh job's wait for every group.
    """

    def __init__(
        self,
        replica_id: int | None = None,
        num_replica_groups: int | None = None,
        lighthouse: str | None = None,
        min_replicas: int = 1,
        quorum_timeout: float | None = None,
        lighthouse_wait: float = 30.0,
        start_alone: bool = False,
        backend: str = "gloo",
        init_method: str = "env://",
        timeout: float = DEFAULT_TIMEOUT_S,
        socket_ifname: str | None = None,
        find_unused_parameters: bool = False,
        bucket_cap_mb: float | None = None,
        static_graph: bool = False,
        gradient_as_bucket_view: bool = False,
    ) -> None:
        DDPStrategy.__init__(self, backend, init_method, timeout, socket_ifname, find_unused_parameters, bucket_cap_mb,
                             static_graph, gradient_as_bucket_view)
        self._init_replica_group("ft", replica_id, num_replica_groups, lighthouse, min_replicas, quorum_timeout,
                                 lighthouse_wait, start_alone, timeout)


@raised_alike_on_every_rank()  # the recipe alone
def _refuse_scaled_precision(precision: str, name: str) -> None:
    """16-mixed's GradScaler overflows as a matter of course (it skips that step and lowers its
    scale), but the replicas check the gradients before it unscales them: the overflow would stop
    the replica as a non-finite loss (under ft_fsdp on the ranks whose shard overflowed only)."""
    if precision == "16-mixed":
        raise ConfigError(f"trainer.precision=16-mixed cannot be used with trainer.strategy={name}: the gradient "
                          "scaler's normal overflow steps would stop a replica as a non-finite loss; use "
                          "trainer.precision=bf16-mixed (no scaler) or 32-true")


def _check_ids(replica_id: Any, groups: Any, min_replicas: Any, name: str = "ft") -> None:
    if replica_id is None or groups is None:
        raise ConfigError(f"trainer.strategy={name} needs this group's replica_id and the job's num_replica_groups, e.g. "
                          f"trainer.strategy={{name: {name}, replica_id: 0, num_replica_groups: 2, "
                          "lighthouse: http://HOST:29510}")
    for key, value in (("replica_id", replica_id), ("num_replica_groups", groups), ("min_replicas", min_replicas)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"trainer.strategy.{key}={value!r} must be a whole number")
    if groups < 1:
        raise ConfigError(f"trainer.strategy.num_replica_groups={groups} must be at least 1")
    if not 0 <= replica_id < groups:
        raise ConfigError(f"trainer.strategy.replica_id={replica_id} must be in 0..{groups - 1} "
                          f"(num_replica_groups={groups})")
    if not 1 <= min_replicas <= groups:
        raise ConfigError(f"trainer.strategy.min_replicas={min_replicas} must be in 1..{groups}")
