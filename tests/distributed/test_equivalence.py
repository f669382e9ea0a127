"""Property 1: 2 Gloo ranks with per-rank batch B end where 1 process with batch 2B ends.

Each case runs real processes, under fw's own launcher (plain ``python script.py`` with
devices=2) or under ``python -m torch.distributed.run``, with each init method. The single-process
reference runs in the test process with ``strategy="single"`` on the same data and seed.
"""

from __future__ import annotations

import json

import pytest
import torch

from . import workload
from .helpers import check_ok, free_port, run_script, write_script

B = 4  # per-rank batch size

SCRIPT = """
import json, os, sys
import torch
import workload

cfg = json.loads(sys.argv[1])
for case in cfg["cases"]:
    strategy = {"name": "ddp_gloo", "init_method": case["init_method"], "timeout": 30}
    out = workload.fit_regressor(strategy, devices=2, batch_size=cfg["batch_size"], accumulate=case["accumulate"])
    assert out["world_size"] == 2, out["world_size"]
    torch.save(out["state"], f"{cfg['out']}/{case['tag']}_rank{out['rank']}.pt")
sys.stdout.flush()
"""

_reference_cache: dict[int, dict] = {}


def reference(accumulate: int) -> dict:
    if accumulate not in _reference_cache:
        out = workload.fit_regressor("single", devices=1, batch_size=2 * B, accumulate=accumulate)
        assert out["world_size"] == 1
        _reference_cache[accumulate] = out["state"]
    return _reference_cache[accumulate]


def init_method(kind: str, tmp_path, tag: str) -> str:
    if kind == "env":
        return "env://"
    if kind == "tcp":
        return f"tcp://127.0.0.1:{free_port()}"
    return f"file://{tmp_path}/rendezvous_{tag}"


# Each job trains twice (accumulate 1, then 2) in the same worker processes: under the elastic
# agent's store a second env:// init_process_group must not read the first one's keys.
@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("kind", "launcher", "accumulates"),
    [("env", "fw", (1, 2)), ("tcp", "torchrun", (1, 2)), ("file", "fw", (1, 2))],
)
def test_ddp_gloo_matches_single_process(kind, launcher, accumulates, tmp_path):
    cases = [{"tag": f"acc{acc}", "accumulate": acc, "init_method": init_method(kind, tmp_path, f"acc{acc}")}
             for acc in accumulates]
    script = write_script(tmp_path, SCRIPT)
    cfg = {"cases": cases, "batch_size": B, "out": str(tmp_path)}
    check_ok(run_script(script, json.dumps(cfg), launcher=launcher, timeout=90))

    for case in cases:
        rank0 = torch.load(tmp_path / f"{case['tag']}_rank0.pt")
        rank1 = torch.load(tmp_path / f"{case['tag']}_rank1.pt")
        ref = reference(case["accumulate"])
        for name, value in ref.items():
            assert torch.equal(rank0[name], rank1[name]), f"{case['tag']}: ranks differ in {name}"
            torch.testing.assert_close(rank0[name], value, rtol=0, atol=1e-5,
                                       msg=lambda m, tag=case["tag"], name=name: f"{tag} {name}: {m}")
        # training moved the parameters, so the equality above is not the trivial one
        workload.fw.seed_everything(0)
        initial = workload.Regressor().state_dict()
        assert any(not torch.allclose(rank0[k], initial[k], atol=1e-3) for k in ref)
