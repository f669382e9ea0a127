"""Bit-exact resume of DDP over Gloo on 4 ranks: a run resumed from a mid-epoch checkpoint ends
with every weight equal, bit for bit, to the run never interrupted.

With 2 ranks a sum of two values has one order, so a 2-rank resume is exact whatever DDP does.
With 3 or more, Gloo's ring all-reduce adds an element's per-rank values in an order that
depends on where the element sits in its gradient bucket, and DDP used to lay its buckets out
one way in a process's first iteration and another way after it (the rebuild in gradient-ready
order): the resumed run's first step, step 2 of the uninterrupted run, was summed in another
order, and the Regressor's weights ended a float32 ulp or two away (1 of 58 here; 7 of 58, up
to 1.5e-8, after 8 steps resumed from step 2). fw now fixes the layout when it wraps the model
on 3 or more ranks (``_fix_bucket_layout`` in framework/strategies/distributed.py).

Both runs are one job of 4 forked ranks (tests/forked.py): the first trains 6 steps and saves a
checkpoint every 2, the second resumes from step 2 in the same processes.
"""

from __future__ import annotations

import json
from itertools import chain

import pytest
from forked import run_script

from .helpers import check_ok, write_script

SCRIPT = """
import json, sys
import torch
from torch.utils.data import DataLoader
import framework as fw
from framework.callbacks import ModelCheckpoint
import workload

out = sys.argv[1]

def fit(name, ckpt_path=None):
    fw.seed_everything(0)
    model = workload.Regressor()
    trainer = fw.Trainer(devices=4, strategy={"name": "ddp_gloo", "timeout": 60}, max_epochs=2, accelerator="cpu",
                         logger=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                         default_root_dir=f"{out}/{name}",
                         callbacks=[ModelCheckpoint(every_n_train_steps=2, save_top_k=-1)])
    # 24 samples, 2 per rank and step: 3 steps an epoch, 6 in all; a checkpoint at steps 2, 4, 6
    trainer.fit(model, DataLoader(workload.regression_data(24), batch_size=2, shuffle=True), ckpt_path=ckpt_path)
    return trainer, [p.detach().flatten().tolist() for p in model.parameters()]

trainer, straight = fit("straight")
trainer, resumed = fit("resumed", f"{out}/straight/checkpoints/epoch=0-step=2.ckpt")
with open(f"{out}/rank{trainer.global_rank}.json", "w") as f:
    json.dump({"step": trainer.global_step, "straight": straight, "resumed": resumed}, f)
"""


@pytest.mark.timeout(90)
def test_a_run_resumed_on_four_ranks_ends_with_the_uninterrupted_weights_bit_for_bit(tmp_path):
    check_ok(run_script(write_script(tmp_path, SCRIPT), str(tmp_path), nprocs=4, timeout=80))
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    assert [r["step"] for r in ranks] == [6] * 4
    assert len(list(chain(*ranks[0]["straight"]))) == 58
    for r in ranks:
        assert r["straight"] == ranks[0]["straight"]  # DDP keeps the replicas equal
        pairs = zip(chain(*r["straight"]), chain(*r["resumed"]), strict=True)
        differing = [(i, a, b) for i, (a, b) in enumerate(pairs) if a != b]
        assert differing == [], f"{len(differing)} of 58 weights differ after the resume: {differing}"
