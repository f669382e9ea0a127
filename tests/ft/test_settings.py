"""``trainer.strategy=ft`` without processes: its options checked with one line each, torchft
imported only when the strategy is built, the data split over groups x ranks, the record of
untrained global batches, and each commit's agreement between replicas (every parameter and buffer
averaged, settings, learning rates and finiteness compared, a stop request agreed, min_replicas,
duplicate ids) with torchft's Manager faked at its boundary; training data the replica groups
cannot share refused."""

from __future__ import annotations

import builtins
import subprocess
import sys
import threading

import pytest
import torch
from torch.distributed import ReduceOp

from framework.data.sampler_injection import in_global_order
from framework.errors import ConfigError, TrainingError
from framework.strategies import create_strategy
from framework.strategies.ft.replicas import Replicas, _QuorumSeen
from framework.strategies.ft.untrained import Untrained

LIGHTHOUSE = "http://127.0.0.1:29510"


def ft(**options):
    return create_strategy({"name": "ft", "lighthouse": LIGHTHOUSE, **options}, "cpu")


@pytest.mark.parametrize(("options", "message"), [
    ({}, "trainer.strategy=ft needs this group's replica_id and the job's num_replica_groups, e.g. "
         "trainer.strategy={name: ft, replica_id: 0, num_replica_groups: 2, lighthouse: http://HOST:29510}"),
    ({"replica_id": 2, "num_replica_groups": 2}, "trainer.strategy.replica_id=2 must be in 0..1 (num_replica_groups=2)"),
    ({"replica_id": 0, "num_replica_groups": 0}, "trainer.strategy.num_replica_groups=0 must be at least 1"),
    ({"replica_id": 0, "num_replica_groups": 2, "min_replicas": 3}, "trainer.strategy.min_replicas=3 must be in 1..2"),
    ({"replica_id": "a", "num_replica_groups": 2}, "trainer.strategy.replica_id='a' must be a whole number"),
    ({"replica_id": 0, "num_replica_groups": 2, "lighthouse": "127.0.0.1"},
     "trainer.strategy.lighthouse '127.0.0.1' must look like http://HOST:PORT"),
])
def test_options_are_checked_with_one_line(options, message):
    with pytest.raises(ConfigError) as err:
        ft(**options)
    assert str(err.value) == message


def test_the_lighthouse_comes_from_the_environment_or_is_asked_for(monkeypatch):
    monkeypatch.delenv("TORCHFT_LIGHTHOUSE", raising=False)
    with pytest.raises(ConfigError, match="no Lighthouse named; give its address"):
        create_strategy({"name": "ft", "replica_id": 0, "num_replica_groups": 2}, "cpu")
    monkeypatch.setenv("TORCHFT_LIGHTHOUSE", "10.0.0.5:29510")
    strategy = create_strategy({"name": "ft", "replica_id": 0, "num_replica_groups": 2}, "cpu")
    assert strategy.lighthouse == "http://10.0.0.5:29510" and strategy.name == "ft"


def test_a_missing_torchft_is_one_line_naming_the_extra(monkeypatch):
    real_import = builtins.__import__

    def without_torchft(name, *args, **kwargs):
        if name == "torchft" or name.startswith("torchft."):
            raise ImportError("No module named 'torchft'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_torchft)
    with pytest.raises(ConfigError, match=r"trainer.strategy=ft needs torchft, which is not installed: pip install "
                                          r"(-e )?'.*\[ft\]' \(or pip install torchft\)"):
        ft(replica_id=0, num_replica_groups=2)


def test_import_framework_does_not_import_torchft():
    code = "import sys, framework, framework.strategies, framework.cli; print('torchft' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"
    # the fw command's parser, `fw lighthouse` in it, is built without torch
    code = "import sys; from framework.cli import build_parser; build_parser(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"


def test_each_group_reads_its_share_and_evaluates_on_the_whole_set():
    strategy = ft(replica_id=1, num_replica_groups=3)
    assert strategy.distributed_sampler_kwargs() == {"num_replicas": 3, "rank": 1}  # one rank per group here
    assert strategy.evaluation_sampler_kwargs() == {"num_replicas": 1, "rank": 0}


def test_untrained_batches_are_kept_as_runs_and_said_in_one_line():
    record = Untrained()
    record.record([(0, 10), (0, 11)], ["1"], "replica missing")
    record.record([(1, 0), (1, 1), (1, 2)], ["1"], "replica missing")
    record.record([(1, 3)], ["0", "1"], "step not committed")
    record.record([(1, 4)], ["1"], "replica missing")
    assert record.batches == 7
    assert record.describe() == (
        "7 global batches (epoch 0 batches 10-11 without replica 1: replica missing; epoch 1 batches 0-2 without "
        "replica 1: replica missing; epoch 1 batch 3 without replicas 0, 1: step not committed; epoch 1 batch 4 "
        "without replica 1: replica missing)")
    copy = Untrained()
    copy.load_state_dict(record.state_dict())
    assert copy == record and copy.since(3).batches == 1


@pytest.mark.parametrize(("manual", "on_nonfinite", "message"), [
    (True, "error", "trainer.strategy=ft averages gradients across replicas in automatic optimization only"),
    (False, "skip", "trainer.on_nonfinite=skip cannot be agreed across replica groups under trainer.strategy=ft"),
])
def test_steps_that_cannot_be_averaged_across_groups_are_refused(manual, on_nonfinite, message):
    strategy = ft(replica_id=0, num_replica_groups=2)
    with pytest.raises(ConfigError, match=message):
        strategy.join_replicas(dict, lambda checkpoint: None, 0, manual, on_nonfinite)
    assert strategy.replicas is None  # refused before any Manager or Lighthouse is touched


# -- the commit's agreement, with torchft's Manager faked at its boundary --------------------------
# Two replicas run in two threads of this process; their "Manager" all-reduces through a barrier
# (MAX, or the average as torchft's AVG), so that the checks every replica makes at each commit are
# exercised without processes. The real thing runs in tests/ft/test_fault_tolerance.py.

class _Hub:
    def __init__(self, n: int) -> None:
        self.n, self.barrier, self.slots = n, threading.Barrier(n, timeout=20), {}

    def reduce(self, who: int, tensor: torch.Tensor, op: ReduceOp) -> None:
        self.slots[who] = tensor.clone()
        self.barrier.wait()
        stacked = torch.stack([self.slots[k] for k in sorted(self.slots)])
        result = stacked.max(0).values if op == ReduceOp.MAX else stacked.sum(0) / self.n
        self.barrier.wait()
        tensor.copy_(result)


class _Manager:
    def __init__(self, hub: _Hub, who: int, participants: int) -> None:
        self.hub, self.who, self.participants, self.error = hub, who, participants, None

    def allreduce(self, tensor, reduce_op=ReduceOp.AVG):
        self.hub.reduce(self.who, tensor, reduce_op)
        return _Done()

    def report_error(self, err):
        self.error = err

    def errored(self):
        return self.error

    def should_commit(self):
        ok, self.error = self.error is None and self.participants >= 1, None
        return ok


class _Done:
    def wait(self):
        return None


def _replicas(who: int, hub: _Hub, *, groups: int = 2, min_replicas: int = 1, facts=dict, buffers=list,
              folders=list, participants: int = 2) -> Replicas:
    """A Replicas as ``Replicas.__init__`` leaves it once its Manager is up and the quorum holds
    ``participants`` groups."""
    replicas = Replicas.__new__(Replicas)
    replicas.replica_id, replicas.num_groups, replicas.min_replicas = str(who), groups, min_replicas
    replicas.facts, replicas.buffers, replicas.folders, replicas.untrained = facts, buffers, folders, Untrained()
    replicas._folder_marks, replicas._folder_names = None, {}
    replicas._open, replicas._window, replicas.position, replicas.global_step = False, [(0, 0)], (0, 0), 0
    replicas.stop_agreed = False
    replicas.ids = [str(i) for i in range(participants)]
    replicas.manager = _Manager(hub, who, participants)
    return replicas


def _both(step):
    """``step(who)`` in two threads at once; what each returned or raised."""
    results: list = [None, None]

    def run(who: int) -> None:
        try:
            results[who] = step(who)
        except Exception as err:
            results[who] = err

    threads = [threading.Thread(target=run, args=(who,)) for who in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


class _Routed(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.norm, self.heads = torch.nn.BatchNorm1d(3), torch.nn.ModuleList([torch.nn.Linear(3, 1) for _ in range(3)])


def test_every_parameter_and_buffer_is_averaged_unused_ones_too():
    """Replica 0 uses head 0, replica 1 head 1, nobody head 2; BatchNorm's statistics come from
    each replica's own data: after the commit both hold the same gradients (head 2 none, as DDP
    leaves a parameter no rank used) and the same buffers."""
    hub, models = _Hub(2), [_Routed(), _Routed()]
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in models]

    def step(who):
        model = models[who]
        x = torch.randn(4, 3, generator=torch.Generator().manual_seed(who))
        model.heads[who](model.norm(x)).sum().backward()
        replicas = _replicas(who, hub, buffers=lambda: list(model.buffers()))
        assert replicas.commit(opts[who])
        opts[who].step()

    assert _both(step) == [None, None]
    a, b = models[0].state_dict(), models[1].state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert models[0].heads[2].weight.grad is None and models[1].heads[2].weight.grad is None
    assert not torch.equal(a["heads.0.weight"], _Routed().state_dict()["heads.0.weight"])


def _tiny():
    model = torch.nn.Linear(2, 1)
    model(torch.ones(1, 2)).sum().backward()
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def test_settings_that_differ_between_replicas_are_refused_on_both():
    hub = _Hub(2)

    def step(who):
        _model, opt = _tiny()
        facts = {"batch size": 4.0, "max_steps": 30.0 if who == 0 else 20.0}
        return _replicas(who, hub, facts=lambda: facts).commit(opt)

    errors = _both(step)
    assert all(isinstance(e, ConfigError) for e in errors), errors
    assert str(errors[1]) == ("replica 1's max_steps 20 differs from another replica's 30 at step 1: every replica "
                              "group must run the same recipe (only trainer.strategy.replica_id differs)")


def test_a_learning_rate_that_differs_between_replicas_is_refused_on_both():
    hub = _Hub(2)

    def step(who):
        _model, opt = _tiny()
        opt.param_groups[0]["lr"] = 0.03 if who == 0 else 0.0003
        return _replicas(who, hub).commit(opt)

    errors = _both(step)
    assert all(isinstance(e, TrainingError) for e in errors), errors
    assert str(errors[1]).startswith("replica 1's learning rate 0.0003 (param group 0) differs from another "
                                     "replica's 0.03 at step 1: decisions such as ReduceLROnPlateau or EarlyStopping "
                                     "must use metrics that agree across replicas")


def test_a_non_finite_gradient_on_one_replica_reaches_none():
    hub = _Hub(2)
    models: list = [None, None]

    def step(who):
        model, opt = _tiny()
        if who == 1:
            model.weight.grad[0, 0] = float("nan")
        models[who] = model
        replicas = _replicas(who, hub)
        return replicas.commit(opt), replicas.untrained.describe()

    survivor, stopped = _both(step)
    assert survivor == (False, "1 global batch (epoch 0 batch 0 without replicas 0, 1: a non-finite loss on a replica)")
    assert isinstance(stopped, TrainingError) and "a non-finite loss or gradient at step 1" in str(stopped)
    assert torch.isfinite(models[0].weight.grad).all()  # the NaN was never averaged in


def test_a_stop_asked_on_one_replica_is_agreed_by_both_at_the_commit():
    hub = _Hub(2)

    def step(who):
        _model, opt = _tiny()
        replicas = _replicas(who, hub)
        committed = replicas.commit(opt, stop=who == 1)
        return committed, replicas.stop_agreed

    assert _both(step) == [(True, True), (True, True)]


def test_a_step_below_min_replicas_is_refused_not_skipped():
    hub = _Hub(1)
    _model, opt = _tiny()
    replicas = _replicas(0, hub, min_replicas=2, participants=1)
    replicas.manager.should_commit = lambda: False  # torchft: fewer than min_replica_size participants
    with pytest.raises(TrainingError, match=r"^replica 0: step 1 cannot be committed: 1 replica group\(s\) in the "
                                            r"quorum, trainer.strategy.min_replicas=2; start the Lighthouse with "
                                            r"--min-replicas 2 so that a step waits for them, or lower min_replicas$"):
        replicas.commit(opt)


def test_a_quorum_fw_cannot_read_or_with_one_id_twice_is_refused():
    class Client:
        def __init__(self, ids):
            self.ids = ids

        def _quorum(self, **kwargs):
            return type("Quorum", (), {"replica_ids": self.ids})()

    seen = _QuorumSeen(Client(["0:a", "1:b", "0:c"]), 2)
    with pytest.raises(ConfigError, match=r"^two replica groups have trainer.strategy.replica_id=0: give each group "
                                          r"its own id, 0..1$"):
        seen._quorum(step=0)
    replicas = _replicas(0, _Hub(1))
    replicas.manager.start_quorum, replicas._seen = lambda: None, _QuorumSeen(Client([]), 2)  # torchft renamed it
    replicas._joining = False
    with pytest.raises(TrainingError, match=r"^torchft .* is not supported \(fw reads its Manager's quorum\): "
                                            r"pip install 'torchft>=0.2,<0.3'$"):
        replicas._quorum()


def test_a_folder_two_replicas_write_into_is_refused(tmp_path):
    hub = _Hub(2)

    def step(who):
        _model, opt = _tiny()
        mine = [str(tmp_path / f"root-{who}"), str(tmp_path / "shared" / "version_0")]
        return _replicas(who, hub, folders=lambda: mine).commit(opt)

    errors = _both(step)
    assert all(isinstance(e, ConfigError) for e in errors), errors
    assert str(errors[0]) == (f"replicas 0 and 1 write logs or checkpoints into the same folder {tmp_path}/shared/"
                              "version_0: give each replica group its own trainer.default_root_dir (and logger "
                              "save_dir, ModelCheckpoint dirpath), e.g. runs/replica<replica_id>")
    hub = _Hub(2)
    assert _both(lambda who: _replicas(who, hub, folders=lambda: [str(tmp_path / f"r{who}")]).commit(_tiny()[1])) == [
        True, True]


class _Stateful:
    """A loader of its own with a position (as torchdata's StatefulDataLoader over a stream)."""

    def __iter__(self):
        return iter([(torch.zeros(4, 8), torch.zeros(4, 1))] * 4)

    def __len__(self):
        return 4

    def state_dict(self):
        return {"read": 0}


class _Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter([(torch.zeros(8), torch.zeros(1))] * 8)


_DATA = torch.utils.data.TensorDataset(torch.randn(16, 8), torch.randn(16, 1))


@pytest.mark.parametrize(("loader", "options", "message"), [
    (torch.utils.data.DataLoader(_DATA, batch_size=4), {"use_distributed_sampler": False},
     "trainer.use_distributed_sampler=false cannot be used with trainer.strategy=ft: every replica group would read "
     "the whole training loader; leave it true (each group reads its share of fw's global order)"),
    (_Stateful(), {},
     "trainer.strategy=ft cannot keep the position of a stateful training loader (_Stateful has state_dict()): each "
     "replica group's state would be its own and a checkpoint holds one group's; use a torch DataLoader over a "
     "map-style data set (fw keeps its position in its global order, the same on every group)"),
    (torch.utils.data.DataLoader(_Stream(), batch_size=4), {},
     "trainer.strategy=ft needs a training loader fw can split over the replica groups: a loader over an iterable "
     "data set (_Stream) is read as it is, the same on every group; use a torch DataLoader over a map-style data set "
     "with its own batch_size (no batch_sampler or DistributedSampler)"),
    (torch.utils.data.DataLoader(_DATA, batch_size=4, sampler=torch.utils.data.DistributedSampler(_DATA, 2, 0)), {},
     "trainer.strategy=ft needs a training loader fw can split over the replica groups: DataLoader with "
     "DistributedSampler is read as it is, the same on every group; use a torch DataLoader over a map-style data set "
     "with its own batch_size (no batch_sampler or DistributedSampler)"),
    (in_global_order(torch.utils.data.DataLoader(_DATA, batch_size=4, shuffle=True), 4, 1, 0), {}, None),
])
def test_training_data_the_replicas_cannot_share_is_refused(loader, options, message):
    """What each group's training loader is once fw built it (the last: fw's share of its global
    order, kept): a position that would differ between groups, or shares that are not shares, are
    refused in one line at the start. (The checks run after set-up, which in one process would
    leave a process group behind: here they are given the run's loaders and settings.)"""
    from types import SimpleNamespace

    from framework.trainer.checkpointing import _refuse_data_replicas_cannot_share

    run = SimpleNamespace(loaders={"train": [loader]}, strategy=SimpleNamespace(name="ft"),
                          settings=SimpleNamespace(use_distributed_sampler=options.get("use_distributed_sampler", True)))
    if message is None:
        _refuse_data_replicas_cannot_share(run)
        return
    with pytest.raises(ConfigError) as err:
        _refuse_data_replicas_cannot_share(run)
    assert str(err.value) == message


def test_the_state_a_healing_peer_receives_is_a_copy_taken_at_the_quorum():
    """torchft serves the state when the peer asks, while this replica's forward already changes
    BatchNorm's buffers in place: what it is given is a copy, made in the quorum thread under
    no_grad (``on_save_checkpoint`` hooks run there)."""
    model = torch.nn.BatchNorm1d(3)
    grad_modes = []

    def save():
        grad_modes.append(torch.is_grad_enabled())
        return {"state_dict": model.state_dict(), "loop": {"epoch": 0}, "pieces": [(model.running_mean, 1)]}

    replicas = _replicas(0, _Hub(1))
    replicas._save = save
    served = replicas._state()
    before = model.running_mean.clone()
    model(torch.randn(8, 3) + 5)  # the step's forward, after the quorum
    assert not torch.equal(model.running_mean, before)
    assert torch.equal(served["fw"]["state_dict"]["running_mean"], before)
    assert torch.equal(served["fw"]["pieces"][0][0], before) and served["fw"]["loop"] == {"epoch": 0}
    assert grad_modes == [False] and served["untrained"] == []


def test_the_untrained_record_survives_a_full_stop_and_a_resume_on_every_replica(tmp_path):
    """The record the writer saved is what every replica reads back from the file at a full stop's
    ``ckpt_path`` resume (through the weights-only loading that every resume uses), and what it
    records afterwards is added to it, so that the next checkpoint holds both."""
    from framework.checkpointing import file as ckpt
    from framework.checkpointing.parts import CheckpointParts

    writer = ft(replica_id=0, num_replica_groups=2)
    writer.untrained.record([(0, 3), (0, 4)], ["1"], "replica missing")
    writer.untrained.record([(1, 0)], ["0", "1"], "step not committed")
    parts = CheckpointParts(shared={"state_dict": torch.nn.Linear(2, 1), "fault_tolerance": writer._fault_tolerance_part()},
                            values={"global_step": 14})
    path = tmp_path / "last.ckpt"
    ckpt.atomic_save(parts.assemble([parts.rank_states()]), path)
    for replica_id in (0, 1):
        resumed = ft(replica_id=replica_id, num_replica_groups=2)
        resumed.load_checkpoint(str(path), CheckpointParts(shared={}, values={}))
        assert resumed.untrained.entries == writer.untrained.entries
        resumed.untrained.record([(1, 5)], ["1"], "replica missing")
        saved = resumed._fault_tolerance_part().state_dict()
        assert saved["untrained_batches"] == 4 and saved["untrained"][:2] == writer.untrained.entries
    assert ckpt.load_checkpoint(path)["fault_tolerance"]["untrained_batches"] == 3
