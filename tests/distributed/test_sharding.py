"""Property 2: every epoch the 2 ranks see disjoint shards covering the data set; the order
changes per epoch (``set_epoch``) and is a function of the seed given to ``fw.seed_everything``.

One 2-rank job (forked ranks, tests/forked.py; ``file://`` init, one rendezvous file per run) trains three
times: seed 1, seed 1 again, seed 2. A training step records the sample indices it saw.
"""

from __future__ import annotations

import json

import pytest
from forked import run_script

from .helpers import check_ok, write_script

N, EPOCHS = 20, 3

SCRIPT = f"""
import json, os, sys
from torch.utils.data import DataLoader
import framework as fw
import workload

out = sys.argv[1]
for run, seed in enumerate([1, 1, 2]):
    fw.seed_everything(seed)
    model = workload.IndexRecorder()
    loader = DataLoader(workload.IndexData({N}), batch_size=3, shuffle=True)
    strategy = {{"name": "ddp_gloo", "init_method": f"file://{{out}}/pg_{{run}}", "timeout": 30}}
    trainer = fw.Trainer(devices=2, strategy=strategy, max_epochs={EPOCHS}, **workload.FIT_ARGS)
    trainer.fit(model, train_dataloaders=loader)
    with open(f"{{out}}/run{{run}}_rank{{trainer.global_rank}}.json", "w") as f:
        json.dump(model.seen, f)
sys.stdout.flush()
"""


@pytest.mark.timeout(45)
def test_shards_disjoint_cover_reshuffle_and_reproduce(tmp_path):
    check_ok(run_script(write_script(tmp_path, SCRIPT), str(tmp_path), nprocs=2, timeout=30))
    runs = []
    for run in range(3):
        ranks = [json.loads((tmp_path / f"run{run}_rank{r}.json").read_text()) for r in range(2)]
        orders = []
        for epoch in range(EPOCHS):
            r0, r1 = ranks[0][str(epoch)], ranks[1][str(epoch)]
            assert len(r0) == len(r1) == N // 2, (run, epoch, r0, r1)
            assert not set(r0) & set(r1), f"run {run} epoch {epoch}: ranks share samples {set(r0) & set(r1)}"
            assert sorted(r0 + r1) == list(range(N)), f"run {run} epoch {epoch}: shards do not cover the data"
            orders.append((r0, r1))
        assert len({json.dumps(o) for o in orders}) == EPOCHS, f"run {run}: order repeats across epochs"
        runs.append(orders)
    assert runs[0] == runs[1], "the same seed gave different orders"
    assert runs[0] != runs[2], "a different seed gave the same orders"
