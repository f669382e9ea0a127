"""fw's own decisions under ``trainer.strategy=ft``/``ft_fsdp`` taken as one by every rank of a
replica group, without processes: a non-finite gradient in one rank's shard, a stop seen by one
rank only, the join's deadline, a heal that failed (on some ranks, or at the last quorum, where the
peer serving the state must wait for the download). Ranks are threads; torchft's Manager is faked
at its boundary (``test_settings.py``'s ``_Manager``: an all-reduce over rank r of every group),
and the group's collectives are faked the same way over the ranks of one group."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from framework.errors import DistributedSetupError, TrainingError
from tests.ft.test_settings import _Hub, _Manager, _replicas


class _Group:
    """The ``ft`` strategy's collectives over the ranks of one group (threads)."""

    def __init__(self, size: int) -> None:
        self.size, self.barrier, self.slots = size, threading.Barrier(size, timeout=5), {}

    def _gather(self, rank: int, value):
        self.slots[rank] = value
        self.barrier.wait()
        values = [self.slots[r] for r in range(self.size)]
        self.barrier.wait()
        return values

    def on(self, rank: int):
        group = self

        class Strategy:
            def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
                values = [bool(v) for v in group._gather(rank, decision)]
                return builtins_all(values) if all else any(values)

            def broadcast(self, obj, src: int = 0):
                return group._gather(rank, obj)[src]

        return Strategy()


builtins_all = all


def _ranks(groups: int, ranks: int, step, manager=_Manager):
    """``step(group, rank, replicas)`` on every rank of every group at once (threads), each with a
    Replicas whose Manager meets rank r of every group and whose strategy meets its group's ranks;
    what each returned or raised, as {(group, rank): result}."""
    hubs, group_of = [_Hub(groups) for _ in range(ranks)], [_Group(ranks) for _ in range(groups)]
    results: dict = {}

    def run(g: int, r: int) -> None:
        replicas = _replicas(g, hubs[r], groups=groups, participants=groups)
        replicas.manager = manager(hubs[r], g, groups)
        replicas.group_ranks, replicas._strategy, replicas.received = ranks, group_of[g].on(r), None
        try:
            results[g, r] = step(g, r, replicas)
        except Exception as err:
            results[g, r] = err

    threads = [threading.Thread(target=run, args=(g, r)) for g in range(groups) for r in range(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    return results


def _shard():
    """One rank's shard of a model: its gradient, finite."""
    model = torch.nn.Linear(2, 1)
    model(torch.ones(1, 2)).sum().backward()
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def test_a_non_finite_gradient_in_one_ranks_shard_stops_that_whole_group_only():
    """ft_fsdp: group 0's rank 1 alone holds the inf (its shard): both ranks of group 0 stop with
    the one line, neither rank of either group applies the step, and group 1 goes on."""

    def step(g, r, replicas):
        _model, opt = _shard()
        if (g, r) == (0, 1):
            opt.param_groups[0]["params"][0].grad[0, 0] = float("inf")
        return replicas.commit(opt)

    results = _ranks(2, 2, step)
    for r in (0, 1):
        assert isinstance(results[0, r], TrainingError), results
        assert str(results[0, r]).startswith("replica 0: a non-finite loss or gradient at step 1")
        assert results[1, r] is False  # not committed, and no error: it goes on


def test_a_stop_one_rank_saw_is_taken_by_every_rank_of_its_group():
    """Group 0 asks to stop; on group 1 the agreement's all-reduce failed on rank 1 only (its own
    Manager recorded an error): both ranks of group 1 take the same branch, the stop."""

    class FailsOnce(_Manager):
        def allreduce(self, tensor, **kwargs):
            work = super().allreduce(tensor, **kwargs)
            if self.who == 1 and threading.current_thread().name.endswith("rank1") and self.error is None:
                self.error = RuntimeError("peer closed the connection")
            return work

    def step(g, r, replicas):
        threading.current_thread().name = f"rank{r}"
        _model, opt = _shard()
        replicas.commit(opt, stop=g == 0)
        return replicas.stop_agreed

    results = _ranks(2, 2, step, manager=FailsOnce)
    assert results == {(0, 0): True, (0, 1): True, (1, 0): True, (1, 1): True}


def _quorums(replicas, barrier: threading.Barrier, ids: list[str], counts: dict, key) -> None:
    """Each quorum is a barrier of the group's ranks, as torchft's ManagerServer makes it."""

    def quorum() -> None:
        barrier.wait()
        replicas.ids = ids
        counts[key] = counts.get(key, 0) + 1

    replicas._quorum = quorum


def test_the_join_ends_after_the_same_quorum_on_every_rank_of_a_group():
    """A group alone (start_alone) whose rank 1 comes 0.3 s later than rank 0: rank 0's clock ends
    the wait, and both ranks leave after the same quorum (each rank's own deadline made rank 0 train
    while rank 1 asked for one more quorum, a hang)."""
    barrier, counts = threading.Barrier(2, timeout=3), {}

    def step(g, r, replicas):
        _quorums(replicas, barrier, ["0"], counts, r)
        replicas.num_groups = 2  # the other group never comes
        if r == 1:
            time.sleep(0.3)
        return replicas.join(0.5, 0, start_alone=True)

    results = _ranks(1, 2, step)
    assert results == {(0, 0): None, (0, 1): None}
    assert counts[0] == counts[1] >= 2


class _Quorum:
    def __init__(self, ids: list[str], heal: bool) -> None:
        self.replica_ids, self.heal = ids, heal


class _Seen:
    last = None


def _healing(replicas, heal_ok: bool, ids: list[str]) -> None:
    """torchft's start_quorum as the healing side sees it: a heal is due; where the download fails,
    the Manager records the error and goes on with this replica's own state."""
    replicas._seen = _Seen()

    def start_quorum() -> None:
        replicas.manager.error = None
        replicas._seen.last = _Quorum(ids, heal=True)
        if not heal_ok:
            replicas.manager.error = RuntimeError("<urlopen error [Errno 111] Connection refused>\ntraceback ...")

    replicas.manager.start_quorum = start_quorum


@pytest.mark.parametrize("joining", [True, False])
def test_a_heal_that_failed_on_one_rank_stops_every_rank_of_the_group(joining):
    """Rank 1's download failed, rank 0's arrived: neither rank goes on (at the join the group
    would train from a mix of its own and the peer's shards; in the fit, with stale weights)."""

    def step(g, r, replicas):
        _healing(replicas, heal_ok=r == 0, ids=["0", "1"])
        replicas._load = lambda state: None
        if joining:
            replicas.ids = []
            return replicas.join(0.0, 0)
        replicas._joining = False
        return replicas.before_batch(0, 3, 3)

    results = _ranks(1, 2, step)
    kind = DistributedSetupError if joining else TrainingError
    assert all(isinstance(e, kind) for e in results.values()), results
    assert str(results[0, 1]) == ("replica 0 could not take its peers' state at step 3 (the heal failed: <urlopen "
                                  "error [Errno 111] Connection refused>): its weights are not its peers'; restart "
                                  "this replica, it heals when it joins").replace("step 3", f"step {0 if joining else 3}")
    assert "(the heal failed: on another rank of this group)" in str(results[0, 0])


def test_the_last_quorum_waits_until_the_healing_replica_has_its_peers_state():
    """Replica 1 serves its state at the last quorum; replica 0's download takes 0.5 s: replica 1
    leaves ``last_quorum`` only after the download ended (before, it left at once, shut its server
    down, and replica 0's heal failed: replicas with different weights, both exit 0)."""
    downloaded = threading.Event()
    left_at_download: list[bool] = []

    def step(g, r, replicas):
        replicas._seen, replicas._joining = _Seen(), False

        def start_quorum() -> None:
            replicas._seen.last = _Quorum(["0", "1"], heal=g == 0)
            if g == 0:
                time.sleep(0.5)  # the peer's state, downloaded in torchft's quorum thread
                downloaded.set()

        replicas.manager.start_quorum = start_quorum
        replicas.last_quorum(0, 9, 9)
        if g == 1:
            left_at_download.append(downloaded.is_set())

    results = _ranks(2, 1, step)
    assert results == {(0, 0): None, (1, 0): None}
    assert left_at_download == [True]
