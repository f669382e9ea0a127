"""One replica group's place among the others, each step: torchft's ``Manager`` asks the Lighthouse
for a quorum at the step's start, averages the gradients over the replicas in it, and commits the
step (or not) before the optimizer steps.

The loop calls two methods at each step (``loops/training_step.py``): ``before_batch`` at a step's first batch
(the quorum; torchft's ``start_quorum``, run synchronously so that a heal is applied before any
batch of the step is trained) and ``commit`` before the optimizer's step (the all-reduce across
the replicas, after DDP's inside the group, then ``should_commit``; a step not committed is not
applied). Each commit first makes the replicas agree, in two small all-reduces: the settings
that must be the same everywhere, the position, each learning rate, which parameters have a
gradient somewhere, whether every gradient is finite, whether some replica asks to stop
(``trainer.should_stop``: every replica then stops after this step), and the folders each
replica writes; a difference is one line on every replica. Then every parameter's gradient and every floating-point
buffer is averaged, so that all replicas hold the same module. ``join`` is the first quorum, at set-up: a replica behind its live peers (restarted
after a loss) receives a peer's whole state there, the same parts a checkpoint holds, and the
Trainer restores it as it restores a checkpoint, so that it continues bit for bit where the peer
stands. A job that starts waits there until every replica group has come. After the fit's last
step the replicas meet once more (``last_quorum``), so that one whose last commit failed takes its
peers' state there. A heal that fails stops the replica with one line. fw's own decisions that
read one rank's view (a finite gradient in its FSDP shard, a stop, a heal's success, the join's
end) are agreed among the group's ranks, so that they all take the same branch around the
collectives that follow.

Every quorum is compared with the one before: a replica that left or came back is said in one
line with the number of participants; each step trained without some replica's share is recorded
(``untrained.py``).
"""

from __future__ import annotations

import datetime
import logging
import math
import os
import time
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist

from framework.errors import ConfigError, DistributedSetupError, TrainingError
from framework.rank_zero import rank_zero_info
from framework.strategies.ft.lighthouse import check_reachable, import_torchft
from framework.strategies.ft.untrained import Untrained

if TYPE_CHECKING:
    from framework.strategies.distributed import DistributedStrategy
    from framework.strategies.ft.strategy import ReplicaGroup

#: how many of a replica's folders are compared with the other replicas' (``Replicas._marks``)
_FOLDERS = 8


class _QuorumSeen:
    """torchft's ManagerClient, keeping the last quorum's result: the Manager keeps only the
    counts, and the line about a lost replica needs its id."""

    def __init__(self, client: Any, num_groups: int) -> None:
        self._client, self.last, self._num_groups = client, None, num_groups

    def _quorum(self, *args: Any, **kwargs: Any) -> Any:
        """The quorum, refused before torchft acts on it (a heal) when two members share an id."""
        self.last = self._client._quorum(*args, **kwargs)
        members = [str(member).split(":")[0] for member in getattr(self.last, "replica_ids", [])]
        for twice in sorted({m for m in members if members.count(m) > 1}, key=_by_number):
            raise ConfigError(f"two replica groups have trainer.strategy.replica_id={twice}: give each group its own "
                              f"id, 0..{self._num_groups - 1}")
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
        facts: the run's settings that must be the same on every replica (name -> number), read at
            each commit (the batches an epoch are known once the training starts).
        buffers: the module's buffers, averaged over the replicas at each commit.
        folders: where this replica writes logs and checkpoints (read at the first commit): a
            folder another replica writes too is refused.
    """

    #: the group's ranks whose buffers differ (FSDP keeps one per rank): averaged inside the group first
    buffer_ranks = 1
    #: the group's ranks: fw's own decisions (finiteness, a stop, a heal's success, the join's end) are agreed among them
    group_ranks = 1

    def __init__(self, strategy: ReplicaGroup, save: Callable[[], dict], load_in_place: Callable[[dict], None],
                 untrained: Untrained, manager_state: dict | None,
                 facts: Callable[[], dict[str, float]] = dict, buffers: Callable[[], list[torch.Tensor]] = list,
                 folders: Callable[[], list[str]] = list) -> None:
        torchft = import_torchft()
        self.replica_id, self.num_groups = str(strategy.replica_id), strategy.num_replica_groups
        self.min_replicas, self.facts, self.buffers, self.folders = strategy.min_replicas, facts, buffers, folders
        self._folder_marks: list[float] | None = None
        self._folder_names: dict[float, str] = {}
        self.untrained, self._save, self._load_in_place = untrained, save, load_in_place
        self.received: dict | None = None  # a peer's state, taken at the join
        self._joining, self._open = False, False
        self._window: list[tuple[int, int]] = []  # the step's (epoch, batch) pairs, until its commit
        self.ids: list[str] = []
        self.position: tuple[int, int] = (0, 0)
        self.global_step = 0  # fw's (every step trained or not; torchft's counts the committed ones)
        self.stop_agreed = False  # some replica asked to stop (``trainer.should_stop``), as a commit's agreement said
        self._lost_at: dict[str, int] = {}  # a replica's id -> len(untrained.entries) when it left
        self.buffer_ranks = strategy.world_size if getattr(strategy, "buffers_per_rank", False) else 1
        self.group_ranks = strategy.world_size
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
        self._seen = _QuorumSeen(self.manager._client, self.num_groups)
        self.manager._client = self._seen  # private, but the only place the quorum's members are known
        self._strategy = strategy

    # -- the state a healing peer receives ------------------------------------------------
    def _state(self) -> dict:
        """Called in torchft's quorum thread while this rank waits for the quorum (the main thread
        is blocked in ``start_quorum``): the state as it stands at this step's start, as a copy.

        torchft's HTTP transport keeps the tensors it is given (``send_checkpoint`` moves only GPU
        tensors to the CPU) and serializes them when the healing peer's request comes, under a
        lock that only ``should_commit`` takes back (``disallow_checkpoint``): by then this
        replica's main thread has left ``start_quorum`` and runs the step's forward, which changes
        BatchNorm's running statistics (and any state a module updates in place) while they are
        read. So every tensor is copied here, into CPU memory (where torchft would move it), before
        the main thread goes on. The ``on_save_checkpoint`` hooks run here too, in torchft's
        thread while the main thread waits, under ``torch.no_grad()``."""
        with torch.no_grad():
            return _copied({"fw": self._save(), "untrained": self.untrained.state_dict()})

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
    def join(self, wait_s: float, global_step: int, start_alone: bool = False) -> dict | None:
        """The first quorum; a peer's state when this replica is behind the live ones (else None).
        A job that starts (from scratch or from a checkpoint) waits up to ``wait_s`` seconds for
        every replica group, so that all of them train from its first step; a replica that heals
        joins a running job at once. A replica still alone after the wait, with no checkpoint and
        nothing to heal from, is refused unless ``start_alone`` (it would train a model of its own)."""
        self._joining, self.global_step = True, global_step
        deadline = time.monotonic() + wait_s
        try:
            while True:
                self._quorum()
                done = self.received is not None or len(self.ids) >= self.num_groups or time.monotonic() >= deadline
                if self.group_ranks > 1:  # each quorum is a barrier of the group's ranks: rank 0's clock decides
                    done = self._strategy.broadcast(done)
                if done:
                    break
                time.sleep(0.2)
        finally:
            self._joining = False
        self._open = True  # this quorum is the first step's
        if self.received is None and global_step == 0 and len(self.ids) < 2 <= self.num_groups and not start_alone:
            raise DistributedSetupError(
                f"replica {self.replica_id} found no other replica group at the Lighthouse within {wait_s:g} s "
                "(trainer.strategy.timeout) and has no checkpoint: it would train a model of its own; start the "
                "other groups with it, or set trainer.strategy.start_alone=true to let it begin alone")
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

    def commit(self, optimizer: torch.optim.Optimizer, usable: bool = True, stop: bool = False) -> bool:
        """Check that the replicas agree (``_agree``), average the gradients of every parameter
        of the optimizer's groups and the module's floating-point buffers over the replicas in the
        quorum, then ask whether the step may be applied (torchft's ``should_commit``: False when
        an all-reduce failed, or when fewer than ``min_replicas`` replicas are in it).

        A non-finite loss or gradient on any replica (``usable=False``: a loss found non-finite
        here) is known to every replica from the agreement: no replica applies the step, the
        replica that met it stops with an error and the others go on without it.

        ``stop``: this replica asks to stop (``trainer.should_stop``). Once any replica asked, in an
        agreement every replica completed, ``stop_agreed`` is True on all of them, whether or not
        this replica's commit then succeeds: every replica stops after this step, and one whose
        commit failed takes its peers' state at the last quorum (``last_quorum``)."""
        self._open, window, self._window = False, self._window, []
        params = [p for group in optimizer.param_groups for p in group["params"]]
        finite = usable and _finite(params)
        if self.group_ranks > 1:  # under FSDP each rank sees its own shard: the group stops or goes on as one
            finite = self._in_group(finite, every=True)
        any_grad, everywhere_finite = self._agree(optimizer, params, finite, stop)
        if everywhere_finite:
            self._all_reduce(params, any_grad)
            self._average_buffers()
        else:
            self.manager.report_error(RuntimeError("a non-finite loss on a replica: the step is dropped everywhere"))
        committed = self.manager.should_commit()
        if not finite:
            raise TrainingError(
                f"replica {self.replica_id}: a non-finite loss or gradient at step {self.global_step + 1} (epoch "
                f"{self.position[0]}, batch {self.position[1]}): this replica stops (trainer.on_nonfinite=error); "
                "no replica applied the step and the others go on without this one")
        if not committed:
            self._refuse_below_min_replicas()
            reason = "step not committed" if everywhere_finite else "a non-finite loss on a replica"
            self.untrained.record(window, [str(i) for i in range(self.num_groups)], reason)
        elif len(self.ids) < self.num_groups:
            missing = [i for i in map(str, range(self.num_groups)) if i not in self.ids]
            self.untrained.record(window, missing, "replica missing")
        return committed

    def last_quorum(self, epoch: int, batches_done: int, global_step: int) -> None:
        """After the fit's last step, on every replica (the replicas stop after the same step): a
        replica whose last commit failed while its peers' succeeded takes their state here, as it
        would at its next step, so that every replica ends with the same model. The quorum ends
        with one small all-reduce across the replicas: a replica that heals reaches it only once
        its peer's state is in place, so that the peer serving it cannot leave (and stop serving)
        before."""
        self.position, self.global_step = (epoch, batches_done), global_step
        self._quorum()
        self._open = False
        self.manager.allreduce(torch.zeros(1)).wait()

    def _agree(self, optimizer: torch.optim.Optimizer, params: list[torch.Tensor],
               finite: bool, stop: bool = False) -> tuple[list[bool], bool]:
        """Two small all-reduces (MAX of each value and of its negation: every replica learns the
        largest and the smallest): first the run's settings (``facts``), the position and the
        sizes of what follows (a fixed length, so that replicas built differently still meet),
        then each parameter group's learning rate and which parameters have a gradient on some
        replica. A value that differs between replicas is refused in one line on every replica.
        Returns which parameters have a gradient on some replica, and whether every replica's
        loss and gradients are finite; sets ``stop_agreed`` when some replica asks to stop (not
        when the all-reduce failed: a request then waits for the next step's, on every replica)."""
        facts = {**self.facts(), "num_replica_groups": float(self.num_groups), "epoch": float(self.position[0]),
                 "batch": float(self.position[1]), "number of param groups": float(len(optimizer.param_groups)),
                 "number of parameters": float(len(params)), "stop": float(stop), "finite": float(finite)}
        low, high = self._min_max(list(facts.values()))
        seen = high[-2] == 1.0 and self.manager.errored() is None  # errored() is this rank's: agreed in the group
        if self.group_ranks > 1:
            seen = self._in_group(seen, every=False)
        self.stop_agreed = self.stop_agreed or seen
        for (key, mine), lo, hi in zip(facts.items(), low, high, strict=True):
            if lo != hi and key not in ("stop", "finite"):
                other = hi if mine == lo else lo
                raise ConfigError(f"replica {self.replica_id}'s {key} {_number(mine)} differs from another replica's "
                                  f"{_number(other)} at step {self.global_step + 1}: every replica group must run "
                                  "the same recipe (only trainer.strategy.replica_id differs)")
        everywhere_finite = low[-1] == 1.0
        lrs = [float(group.get("lr", 0.0)) for group in optimizer.param_groups]
        marks = self._marks()
        low, high = self._min_max(lrs + marks + [float(p.grad is not None) for p in params])
        self._refuse_shared_folders(marks, high[len(lrs):len(lrs) + len(marks)])
        for i, (mine, lo, hi) in enumerate(zip(lrs, low, high, strict=False)):
            if lo != hi:
                other = hi if mine == lo else lo
                raise TrainingError(
                    f"replica {self.replica_id}'s learning rate {mine:g} (param group {i}) differs from another "
                    f"replica's {other:g} at step {self.global_step + 1}: decisions such as ReduceLROnPlateau or "
                    "EarlyStopping must use metrics that agree across replicas (validation metrics, or metrics "
                    "synced across replicas)")
        return [h == 1.0 for h in high[len(lrs) + len(marks):]], everywhere_finite

    def _marks(self) -> list[float]:
        """This replica's folders as numbers in its own row of ``num_groups`` x ``_FOLDERS`` slots
        (zeros elsewhere): after a MAX all-reduce every replica sees every replica's folders."""
        if self._folder_marks is None:
            folders = sorted({os.path.abspath(f) for f in self.folders()})[:_FOLDERS]
            mine = [float(zlib.crc32(f.encode()) + 1) for f in folders] + [0.0] * (_FOLDERS - len(folders))
            row = int(self.replica_id) if self.replica_id.isdigit() else 0
            self._folder_marks = [0.0] * (_FOLDERS * row) + mine + [0.0] * (_FOLDERS * (self.num_groups - row - 1))
            self._folder_names = dict(zip(mine, folders, strict=False))
        return self._folder_marks

    def _refuse_shared_folders(self, marks: list[float], seen: list[float]) -> None:
        row = int(self.replica_id) if self.replica_id.isdigit() else 0
        for other in range(self.num_groups):
            if other == row:
                continue
            theirs = set(seen[other * _FOLDERS:(other + 1) * _FOLDERS]) - {0.0}
            for mark in marks[row * _FOLDERS:(row + 1) * _FOLDERS]:
                if mark and mark in theirs:
                    raise ConfigError(
                        f"replicas {min(row, other)} and {max(row, other)} write logs or checkpoints into the same folder "
                        f"{self._folder_names[mark]}: give each replica group its own trainer.default_root_dir (and "
                        "logger save_dir, ModelCheckpoint dirpath), e.g. runs/replica<replica_id>")

    def _min_max(self, values: list[float]) -> tuple[list[float], list[float]]:
        """Each value's smallest and largest over the replicas in the quorum (one all-reduce)."""
        from torch.distributed import ReduceOp

        n = len(values)
        both = torch.tensor(values + [-v for v in values], dtype=torch.float64)
        self.manager.allreduce(both, reduce_op=ReduceOp.MAX).wait()
        return [-v for v in both[n:].tolist()], both[:n].tolist()

    def _all_reduce(self, params: list[torch.Tensor], any_grad: list[bool]) -> None:
        """One flat all-reduce per dtype through the Manager (the average over the quorum's
        replicas; torchft skips it after an error, and the commit then fails). Every parameter
        that has a gradient on some replica takes part, with zeros where it has none here (as
        DDP does for an unused parameter); one without a gradient anywhere keeps none. Under
        FSDP each rank's gradient is its local shard (a DTensor's): the Manager joins rank r of
        every group, whose shards have the same layout (``fsdp.py`` checks the groups' shape)."""
        groups: dict[torch.dtype, list[torch.Tensor]] = {}
        for p, used in zip(params, any_grad, strict=True):
            if used:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                grad = local_shard(p.grad)
                groups.setdefault(grad.dtype, []).append(grad)
        for grads in groups.values():
            flat = torch._utils._flatten_dense_tensors(grads)
            self.manager.allreduce(flat).wait()
            for grad, averaged in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads), strict=True):
                grad.copy_(averaged)

    def _average_buffers(self) -> None:
        """The module's floating-point buffers (BatchNorm's running statistics) averaged over the
        replicas in the quorum, so that every replica evaluates and saves the same module. Where
        the group's ranks hold buffers of their own (FSDP keeps them per rank), they are first
        averaged inside the group, so that every rank of every group ends with the same."""
        buffers = [local_shard(b) for b in self.buffers() if torch.is_floating_point(b)]
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for b in buffers:
            by_dtype.setdefault(b.dtype, []).append(b)
        for tensors in by_dtype.values():
            flat = torch._utils._flatten_dense_tensors([t.detach() for t in tensors])
            if self.buffer_ranks > 1:
                dist.all_reduce(flat)
                flat /= self.buffer_ranks
            self.manager.allreduce(flat).wait()
            with torch.no_grad():
                for t, averaged in zip(tensors, torch._utils._unflatten_dense_tensors(flat, tensors), strict=True):
                    t.copy_(averaged)

    def _refuse_below_min_replicas(self) -> None:
        if len(self.ids) < self.min_replicas:
            raise TrainingError(
                f"replica {self.replica_id}: step {self.global_step + 1} cannot be committed: {len(self.ids)} replica "
                f"group(s) in the quorum, trainer.strategy.min_replicas={self.min_replicas}; start the Lighthouse "
                f"with --min-replicas {self.min_replicas} so that a step waits for them, or lower min_replicas")

    def _quorum(self) -> None:
        """torchft's ``start_quorum``, then the line when the replicas in it changed."""
        try:
            self.manager.start_quorum()
        except (TrainingError, ConfigError):
            raise
        except Exception as err:
            raise DistributedSetupError(
                f"replica {self.replica_id} got no quorum from the Lighthouse at {self._strategy.lighthouse} "
                f"({str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__}): is it still "
                "running? (trainer.strategy.quorum_timeout)") from None
        result, self._seen.last = self._seen.last, None
        if result is None:
            raise TrainingError(f"torchft {_torchft_version()} is not supported (fw reads its Manager's quorum): "
                                "pip install 'torchft>=0.2,<0.3'")
        self._refuse_failed_heal(bool(getattr(result, "heal", False)))
        ids = sorted({str(member).split(":")[0] for member in result.replica_ids}, key=_by_number)
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

    def _refuse_failed_heal(self, heal: bool) -> None:
        """A heal torchft could not complete (the peer's state did not arrive: torchft records the
        error and goes on with this replica's own state) stops the replica on every rank of its
        group: its state is not its peers', and under FSDP a group would mix a peer's shards
        with its own."""
        error = self.manager.errored() if heal else None
        failed = error is not None
        if self.group_ranks > 1:
            failed = self._in_group(failed, every=False)
        if not failed:
            return
        why = _first_line(error) if error is not None else "on another rank of this group"
        kind = DistributedSetupError if self._joining else TrainingError
        raise kind(f"replica {self.replica_id} could not take its peers' state at step {self.global_step} (the heal "
                   f"failed: {why}): its weights are not its peers'; restart this replica, it heals when it joins")

    def _in_group(self, flag: bool, every: bool) -> bool:
        """``flag`` agreed by the group's ranks (one small all-reduce): on all of them (``every``)
        or on any. The ``ReplicaGroup`` mixin always sits on a distributed strategy."""
        return bool(cast("DistributedStrategy", self._strategy).reduce_boolean_decision(flag, all=every))

    def writes_checkpoints(self) -> bool:
        """The replica with the lowest id in the last quorum writes the checkpoints."""
        return not self.ids or self.ids[0] == self.replica_id

    def shutdown(self) -> None:
        self.manager.shutdown(wait=False)


def _first_line(error: Any) -> str:
    """An error's first line (torchft's ``ExceptionWithTraceback`` keeps the exception in ``original_exception``)."""
    err = getattr(error, "original_exception", error)
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _torchft_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torchft")
    except PackageNotFoundError:
        return "(version unknown)"


def local_shard(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (the same storage), or the tensor itself."""
    return tensor._local_tensor if hasattr(tensor, "_local_tensor") else tensor


def _finite(params: list[torch.Tensor]) -> bool:
    """Every gradient finite (one read for all)."""
    flags = [torch.isfinite(p.grad).all() for p in params if p.grad is not None]
    return not flags or bool(torch.stack(flags).all())


def _copied(state: Any) -> Any:
    """``state`` with every tensor copied into CPU memory (its dicts, lists and tuples rebuilt)."""
    if isinstance(state, torch.Tensor):
        return state.detach().to("cpu", copy=True)
    if isinstance(state, dict):
        copy = state.copy()  # the same kind of dict (a module's state_dict is an OrderedDict)
        for key, value in copy.items():
            copy[key] = _copied(value)
        return copy
    if isinstance(state, list):
        return [_copied(value) for value in state]
    if isinstance(state, tuple):
        values = [_copied(value) for value in state]
        return type(state)(*values) if hasattr(state, "_fields") else type(state)(values)
    return state


def _number(value: float) -> str:
    return str(int(value)) if math.isfinite(value) and value == int(value) else f"{value:g}"


def _by_number(replica_id: str) -> tuple[int, str]:
    return (int(replica_id), "") if replica_id.isdigit() else (1 << 30, replica_id)


def _group_store(strategy: ReplicaGroup) -> tuple[str, int]:
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
