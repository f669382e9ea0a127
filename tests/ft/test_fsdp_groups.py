"""``trainer.strategy=ft_fsdp`` for real: 2 replica groups x 2 ranks with FSDP inside each, over
Gloo, meeting at a Lighthouse on 127.0.0.1 (``fw lighthouse``, one for the module).

- no failure: every rank of both groups ends with the same parameters (gathered whole), and
  they equal plain ``fsdp`` over the same global batches of 16 (2 ranks of 8 samples) within
  1e-6 (the mean over the 16 samples is summed in another order: 4 ranks' means of 4,
  reduce-scattered over 2 then all-reduced by the Manager over 2, against 2 ranks' means of 8); group 1 resumed from group 0's
  sharded checkpoint of step 4 (``ckpt_path``) holds at step 4, rank by rank, the shards,
  optimizer state and position it held there before, bit for bit;
- SIGKILL of group 1 at a step, restarted under torchrun (``python -m torch.distributed.run``):
  rank r of the restarted group takes rank r of the survivor's shards, so the hash of each
  rank's local shards of weights and optimizer state and of the position equals the survivor's
  same rank at the step it joins, and every rank ends with the same parameters; only group 0
  writes checkpoints (FSDP's sharded folders).

The hashes (``replica.py``) cover each rank's local shards, not the gathered tensors: rank r of
one group is compared with rank r of the other.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.ft.test_fault_tolerance import (  # noqa: F401 (lighthouse, procs: the fixtures)
    REPLICA,
    Procs,
    _env,
    _log,
    _params,
    _steps,
    lighthouse,
    procs,
)

STEPS = "8"  # 6 global batches an epoch (96 samples, 4 a rank, 4 ranks): the run crosses an epoch


def _start_torchrun(procs: Procs, name: str, *args: str) -> subprocess.Popen:  # noqa: F811 (the fixture's name)
    """One replica group of 2 ranks started by torchrun, its output in ``NAME.log``."""
    path = procs.out / f"{name}.log"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", REPLICA,
               str(procs.out), *args]
    with open(path, "w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=procs.out, start_new_session=True,
                                env=_env(TORCHFT_LIGHTHOUSE=procs.lighthouse))
    procs.started.append((proc, path))
    return proc


def _same_everywhere(out: Path, names: list[str]) -> dict[str, torch.Tensor]:
    first = _params(out, names[0])
    for name in names[1:]:
        other = _params(out, name)
        assert first.keys() == other.keys() and all(torch.equal(first[k], other[k]) for k in first), name
    return first


@pytest.mark.timeout(300)
def test_fsdp_groups_end_identical_match_plain_fsdp_and_resume_from_a_sharded_checkpoint(procs: Procs, tmp_path: Path) -> None:  # noqa: F811
    group = ("--fsdp", "--devices", "2", "--max-steps", STEPS, "--every", "4")
    r0 = procs.start("r0", "--replica", "0", *group)
    r1 = procs.start("r1", "--replica", "1", *group)
    # plain fsdp on 2 ranks of 8 samples: the same global batches of 16 as 4 ranks of 4 (the sampler's
    # permutation does not depend on the number of ranks), in 3 processes instead of 5
    plain = procs.start("plain", "--ddp", "--fsdp", "--devices", "2", "--batch-size", "8", "--max-steps", STEPS,
                        "--replica", "9")
    for proc, name in ((r0, "r0"), (r1, "r1"), (plain, "plain")):
        assert procs.wait(proc, 200) == 0, _log(tmp_path, name)
    ft = _same_everywhere(tmp_path, ["0-0", "0-1", "1-0", "1-1"])
    fsdp = _same_everywhere(tmp_path, ["9-0", "9-1"])
    gap = max(float((ft[k] - fsdp[k]).abs().max()) for k in ft)
    print(f"ft_fsdp 2x2 against fsdp on 2 ranks of 8 after {STEPS} steps: largest difference {gap:.3g}")
    assert gap < 1e-6, gap
    assert "fw: replica 0 joined at step 0: participants 2 of 2" in _log(tmp_path, "r0")
    assert not list((tmp_path / "ckpt-1").glob("*.ckpt")), "only the replica with the lowest id writes checkpoints"
    # a full stop: group 1 resumes from group 0's sharded checkpoint of step 4 (mid-epoch), alone (the cheaper
    # run: after its start's wait of 2 s), each rank reading rank r's shards and data position: at step 4 each
    # rank holds what it held there before, bit for bit (tests/ft/test_fault_tolerance.py resumes every group)
    ckpt = tmp_path / "ckpt-0" / "epoch=0-step=4.ckpt"
    assert (ckpt / ".metadata").exists(), "FSDP's sharded folder"
    resumed = procs.start("resumed", "--replica", "1", "--ckpt-path", str(ckpt), "--tag=-resumed", "--timeout", "2",
                          "--fsdp", "--devices", "2", "--max-steps", "5")
    assert procs.wait(resumed, 150) == 0, _log(tmp_path, "resumed")
    assert "fw: replica 1 joined at step 4: participants 1 of 2" in _log(tmp_path, "resumed")
    for rank in (0, 1):
        before, after = _steps(tmp_path, f"1-{rank}"), _steps(tmp_path, f"1-{rank}-resumed")
        assert min(after) == 4 and after[4] == before[4] == _steps(tmp_path, f"0-{rank}")[4], rank

@pytest.mark.timeout(300)
def test_a_killed_fsdp_group_restarted_by_torchrun_heals_rank_by_rank(procs: Procs, tmp_path: Path) -> None:  # noqa: F811
    kill_at, flag = 3, "restarted"
    # BatchNorm (buffers each rank updates from its own share) and a head chosen per batch (unused on some ranks)
    group = ("--fsdp", "--devices", "2", "--max-steps", STEPS, "--every", "4", "--model", "routed")
    r0 = procs.start("r0", "--replica", "0", "--wait-at", str(kill_at + 2), "--wait-for", flag, *group)
    r1 = procs.start("r1", "--replica", "1", "--kill-at", str(kill_at), *group)
    assert procs.wait(r1, 150) != 0, _log(tmp_path, "r1")
    again = _start_torchrun(procs, "r1-again", "--replica", "1", "--tag=-again", "--announce", flag, *group)
    assert procs.wait(again, 150) == 0, _log(tmp_path, "r1-again")
    assert procs.wait(r0, 150) == 0, _log(tmp_path, "r0")  # the same processes from the first step to the last
    survivor, healed = _log(tmp_path, "r0"), _log(tmp_path, "r1-again")
    assert re.search(r"fw: replica 1 lost at step \d+ .*: participants 2 -> 1", survivor), survivor
    joined = re.search(r"fw: replica 1 healed from the state of replica 0 \(a live peer\) at step (\d+)", healed)
    assert joined, healed
    step = int(joined.group(1))
    for rank in (0, 1):  # each rank's shards at the join are the survivor's same rank's, bit for bit
        mine, peer = _steps(tmp_path, f"1-{rank}-again"), _steps(tmp_path, f"0-{rank}")
        assert min(mine) == step and mine[step] == peer[step], (rank, step, mine.get(step), peer.get(step))
    assert _steps(tmp_path, "0-0")[step] != _steps(tmp_path, "0-1")[step], "ranks hash their own shards"
    ended = _same_everywhere(tmp_path, ["0-0", "0-1", "1-0-again", "1-1-again"])  # buffers too
    assert any("running_mean" in k for k in ended)
    assert not list((tmp_path / "ckpt-1").glob("*.ckpt")), "only the replica with the lowest id writes checkpoints"
    assert (tmp_path / "ckpt-0" / "epoch=1-step=8.ckpt" / ".metadata").exists(), "FSDP's sharded folder"


# -- without processes: the options, and the refusals ------------------------------------------------
def _ft_fsdp(**options):
    from framework.strategies import create_strategy

    return create_strategy({"name": "ft_fsdp", "lighthouse": "http://127.0.0.1:29510", **options}, "cpu")


def test_ft_fsdp_takes_ft_and_fsdp_options_and_refuses_hybrid_shard() -> None:
    from framework.errors import ConfigError

    strategy = _ft_fsdp(replica_id=1, num_replica_groups=2, sharding_strategy="SHARD_GRAD_OP", state_dict_type="full",
                        min_replicas=2)
    assert (strategy.name, strategy.replica_id, strategy.min_replicas) == ("ft_fsdp", 1, 2)
    assert (strategy.sharding_strategy, strategy.state_dict_type, strategy.mesh_shape) == ("SHARD_GRAD_OP", "full", None)
    assert strategy.distributed_sampler_kwargs() == {"num_replicas": 2, "rank": 1}  # group 1's rank 0 of 1
    assert strategy.evaluation_sampler_kwargs() == {"num_replicas": 1, "rank": 0}  # inside the group only
    with pytest.raises(ConfigError) as err:
        _ft_fsdp(replica_id=0, num_replica_groups=2, sharding_strategy="hybrid_shard")
    assert str(err.value) == ("trainer.strategy.sharding_strategy=HYBRID_SHARD with strategy ft_fsdp: the replica "
                              "groups are the replicated dimension already; use FULL_SHARD or SHARD_GRAD_OP")
    with pytest.raises(ConfigError, match=r"^trainer.strategy=ft_fsdp needs this group's replica_id"):
        _ft_fsdp()
    with pytest.raises(ConfigError, match="'ft_fsdp' has no option 'device_mesh'"):
        _ft_fsdp(replica_id=0, num_replica_groups=2, device_mesh=[2, 1])


def test_a_peer_state_from_a_group_of_another_size_is_refused() -> None:
    from framework.errors import ConfigError
    from framework.strategies.ft.fsdp import _GROUP

    strategy = _ft_fsdp(replica_id=1, num_replica_groups=2)  # not connected: a group of 1 rank
    with pytest.raises(ConfigError) as err:
        strategy._from_shards({"global_step": 5, _GROUP: {"ranks": 2}})
    assert str(err.value) == ("replica 1 has 1 rank(s) in its group and the live peer it heals from has 2: under "
                              "ft_fsdp rank r's shards line up with rank r's of the other groups only if every group "
                              "has the same number of ranks (trainer.devices x trainer.num_nodes)")
