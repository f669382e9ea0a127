"""``trainer.strategy=ft`` without processes: its options checked with one line each, torchft
imported only when the strategy is built, the data split over groups x ranks, and the record of
untrained global batches."""

from __future__ import annotations

import builtins
import subprocess
import sys

import pytest

from framework.errors import ConfigError
from framework.strategies import create_strategy
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
