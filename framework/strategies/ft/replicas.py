"""One replica group's place among the others, each step: torchft's ``Manager`` asks the Lighthouse
for a quorum at the step's start, averages the gradients over the replicas in it, and commits the
step (or not) before the optimizer steps.

The loop calls two methods (``loops/training_step.py``): ``before_batch`` at a step's first batch
(the quorum; torchft's ``start_quorum``, run synchronously so that a heal is applied before any
batch of the step is trained) and ``commit`` before the optimizer's step (the all-reduce across
the replicas, after DDP's inside the group, then ``should_commit``; a step not committed is not
applied). ``join`` is the first quorum, at set-up: a replica behind its live peers (restarted
after a loss) receives a peer's whole state there, the same parts a checkpoint holds, and the
Trainer restores it as it restores a checkpoint, so that it continues bit for bit where the peer
stands. A job that starts waits there until every replica group has come.

Every quorum is compared with the one before: a replica that left or came back is said in one
line with the number of participants; each step trained without some replica's share is recorded
(``untrained.py``).
"""

from __future__ import annotations

import datetime
import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from framework.errors import DistributedSetupError, TrainingError
from framework.rank_zero import rank_zero_info
from framework.strategies.ft.lighthouse import check_reachable, import_torchft
from framework.strategies.ft.untrained import Untrained

if TYPE_CHECKING:
    from framework.strategies.ft.strategy import FaultTolerantStrategy

class _QuorumSeen:
    """torchft's ManagerClient, keeping the last quorum's result: the Manager keeps only the
    counts, and the line about a lost replica needs its id."""

    def __init__(self, client: Any) -> None:
        self._client, self.last = client, None

    def _quorum(self, *args: Any, **kwargs: Any) -> Any:
        self.last = self._client._quorum(*args, **kwargs)
        return self.last

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


class Replicas:
    """This replica group's torchft Manager and what fw keeps of it (see the module docstring).

    Args:
        strategy: the ``ft`` strategy (its group's ranks, collectives and options).
        save: this rank's whole state as a checkpoint's contents (what a healing peer receives).
        load_in_place: puts a peer's state into the running fit (a replica that fell behind by
            a step it could not commit, at the same batch as the peer).
        untrained: the record of untrained global batches, part of the state.
        manager_state: torchft's step count, from a checkpoint (None: a fresh job).
    """

    def __init__(self, strategy: FaultTolerantStrategy, save: Callable[[], dict], load_in_place: Callable[[dict], None],
                 untrained: Untrained, manager_state: dict | None) -> None:
        torchft = import_torchft()
        self.replica_id, self.num_groups = str(strategy.replica_id), strategy.num_replica_groups
        self.untrained, self._save, self._load_in_place = untrained, save, load_in_place
        self.received: dict | None = None  # a peer's state, taken at the join
        self._joining, self._open = False, False
        self._window: list[tuple[int, int]] = []  # the step's (epoch, batch) pairs, until its commit
        self.ids: list[str] = []
        self.position: tuple[int, int] = (0, 0)
        self.global_step = 0  # fw's (every step trained or not; torchft's counts the committed ones)
        self._lost_at: dict[str, int] = {}  # a replica's id -> len(untrained.entries) when it left
        host, port = _group_store(strategy)
        timeout = datetime.timedelta(seconds=strategy.timeout)
        quorum_timeout = datetime.timedelta(seconds=strategy.quorum_timeout)
        _quiet_torchft()
        self.manager = torchft.Manager(
            pg=torchft.ProcessGroupGloo(timeout=timeout), min_replica_size=strategy.min_replicas,
            load_state_dict=self._load, state_dict=self._state, use_async_quorum=False, timeout=timeout,
            quorum_timeout=quorum_timeout, connect_timeout=datetime.timedelta(seconds=max(strategy.lighthouse_wait, 1.0)),
            rank=strategy.global_rank, world_size=strategy.world_size, store_addr=host, store_port=port,
            lighthouse_addr=strategy.lighthouse, replica_id=self.replica_id, init_sync=True)
        if manager_state is not None:
            self.manager.load_state_dict(manager_state)
        _quiet_checkpoint_server(self.manager)
        self._seen = _QuorumSeen(self.manager._client)
        self.manager._client = self._seen  # private, but the only place the quorum's members are known
        self._strategy = strategy

    # -- the state a healing peer receives ------------------------------------------------
    def _state(self) -> dict:
        """Called in torchft's quorum thread while this rank waits for the quorum (the main thread
        is blocked in ``start_quorum``): the state as it stands at this step's start."""
        return {"fw": self._save(), "untrained": self.untrained.state_dict()}

    def _load(self, state: dict) -> None:
        """A peer's state: kept for the Trainer's restore at the join; during the fit (this replica
        could not commit a step its peers committed), put in place at the same batch."""
        if self._joining:
            self.received = state["fw"]
        else:
            loop = state["fw"].get("loop") or {}
            there = (int(loop.get("epoch", -1)), int(loop.get("batches_done", -1)))
            if loop.get("epoch_finished") or there != self.position:
                raise TrainingError(
                    f"replica {self.replica_id} fell behind its peers (a step it could not commit) and the peer "
                    f"stands at epoch {there[0]}, batch {there[1]} while it is at epoch {self.position[0]}, batch "
                    f"{self.position[1]}: restart this replica; it takes a live peer's state when it joins")
            self._load_in_place(state["fw"])
            rank_zero_info(f"fw: replica {self.replica_id} took a peer's weights and optimizer state at step "
                           f"{self.global_step} (it could not commit the step before)")
        self.untrained.load_state_dict(state["untrained"])

    # -- the steps -------------------------------------------------------------------------
    def join(self, wait_s: float, global_step: int) -> dict | None:
        """The first quorum; a peer's state when this replica is behind the live ones (else None).
        A job that starts (from scratch or from a checkpoint) waits up to ``wait_s`` seconds for
        every replica group, so that all of them train from its first step; a replica that heals
        joins a running job at once."""
        self._joining, self.global_step = True, global_step
        deadline = time.monotonic() + wait_s
        try:
            while True:
                self._quorum()
                if self.received is not None or len(self.ids) >= self.num_groups or time.monotonic() >= deadline:
                    break
                time.sleep(0.2)
        finally:
            self._joining = False
        self._open = True  # this quorum is the first step's
        if self.received is not None:
            self.global_step = int(self.received.get("global_step", global_step))
        rank_zero_info(f"fw: replica {self.replica_id} joined at step {self.global_step}: participants "
                       f"{len(self.ids)} of {self.num_groups} (replicas {', '.join(self.ids)})")
        return self.received

    def before_batch(self, epoch: int, batch_idx: int, global_step: int) -> None:
        """At each batch: a step's first batch asks for its quorum."""
        self.position, self.global_step = (epoch, batch_idx), global_step
        if not self._open:
            self._quorum()
            self._open = True
        self._window.append((epoch, batch_idx))

    def commit(self, optimizer: torch.optim.Optimizer, usable: bool = True) -> bool:
        """Average the gradients over the replicas in the quorum, then ask whether the step may
        be applied (torchft's ``should_commit``: False when an all-reduce failed, or when fewer
        than ``min_replicas`` replicas are in it). ``usable=False`` (a non-finite loss skipped
        here): this replica adds zeros and does not commit."""
        self._open, window, self._window = False, self._window, []
        self._all_reduce(optimizer, zero=not usable)  # the peers wait for this replica's part, zeros or not
        if not usable:
            self.manager.report_error(RuntimeError("a non-finite loss: this replica's gradients were dropped"))
        committed = self.manager.should_commit()
        if not committed:
            self.untrained.record(window, [str(i) for i in range(self.num_groups)], "step not committed")
        elif len(self.ids) < self.num_groups:
            missing = [i for i in map(str, range(self.num_groups)) if i not in self.ids]
            self.untrained.record(window, missing, "replica missing")
        return committed

    def _all_reduce(self, optimizer: torch.optim.Optimizer, zero: bool) -> None:
        """One flat all-reduce per dtype through the Manager (the average over the quorum's
        replicas; torchft skips it after an error, and the commit then fails)."""
        groups: dict[torch.dtype, list[torch.Tensor]] = {}
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    groups.setdefault(p.grad.dtype, []).append(p.grad)
        for grads in groups.values():
            flat = torch._utils._flatten_dense_tensors(grads)
            if zero:
                flat.zero_()
            self.manager.allreduce(flat).wait()
            for grad, averaged in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads), strict=True):
                grad.copy_(averaged)

    def _quorum(self) -> None:
        """torchft's ``start_quorum``, then the line when the replicas in it changed."""
        try:
            self.manager.start_quorum()
        except TrainingError:
            raise
        except Exception as err:
            raise DistributedSetupError(
                f"replica {self.replica_id} got no quorum from the Lighthouse at {self._strategy.lighthouse} "
                f"({str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__}): is it still "
                "running? (trainer.strategy.quorum_timeout)") from None
        result = self._seen.last
        members: list[str] = list(result.replica_ids) if result is not None else []
        ids = sorted({member.split(":")[0] for member in members}, key=_by_number)
        before, self.ids = self.ids, ids
        if not before or ids == before or self._joining:
            return
        where = f"step {self.global_step} (epoch {self.position[0]}, batch {self.position[1]})"
        change = f"participants {len(before)} -> {len(ids)}"
        for lost in (i for i in before if i not in ids):
            self._lost_at[lost] = len(self.untrained.entries)
            rank_zero_info(f"fw: replica {lost} lost at {where}: {change}")
        for back in (i for i in ids if i not in before):
            since = self.untrained.since(self._lost_at.pop(back, len(self.untrained.entries)))
            away = f"; while it was away {since.describe()} were not trained whole" if since.entries else ""
            rank_zero_info(f"fw: replica {back} joined at {where}: {change}{away}")

    def writes_checkpoints(self) -> bool:
        """The replica with the lowest id in the last quorum writes the checkpoints."""
        return not self.ids or self.ids[0] == self.replica_id

    def shutdown(self) -> None:
        self.manager.shutdown(wait=False)


def _by_number(replica_id: str) -> tuple[int, str]:
    return (int(replica_id), "") if replica_id.isdigit() else (1 << 30, replica_id)


def _group_store(strategy: FaultTolerantStrategy) -> tuple[str, int]:
    """The store the group's Manager meets on: rank 0 of the group hosts it, and checks that the
    Lighthouse answers; every rank learns the port (or the refusal) in one broadcast."""
    host = os.environ.get("MASTER_ADDR") or strategy.dist.master_addr or "127.0.0.1"
    found: list[Any] = [None, None]
    if strategy.global_rank == 0:
        try:
            check_reachable(strategy.lighthouse, strategy.lighthouse_wait)
            strategy._manager_store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False)
            found = [strategy._manager_store.port, None]
        except DistributedSetupError as err:
            found = [None, str(err)]
    if strategy.world_size > 1:
        found = strategy.broadcast(found)
    if found[1] is not None:
        raise DistributedSetupError(found[1])
    return host, int(found[0])


def _quiet_checkpoint_server(manager: Any) -> None:
    """torchft's HTTP server that sends a healing peer this replica's state prints an access line
    for each request on stderr (``http.server``'s default); this one server's handler stays quiet."""
    server = getattr(manager._checkpoint_transport, "_server", None)
    if server is not None:
        server.RequestHandlerClass.log_message = lambda *args: None


def _quiet_torchft() -> None:
    """torchft logs every quorum and commit at INFO on the root logger's handlers; fw says what
    matters in its own lines (``TORCHFT_LOG=INFO`` keeps torchft's)."""
    level = os.environ.get("TORCHFT_LOG", "ERROR").upper()
    for name in ("torchft", "torchft.manager", "torchft_quorums", "torchft_commits", "torchft.checkpointing"):
        logging.getLogger(name).setLevel(level)
