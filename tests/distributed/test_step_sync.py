"""``self.log(..., on_step=True, sync_dist=True)`` under DDP logs the reduction over the ranks
(``reduce_fx``: the mean by default, or max), as Lightning does, not rank 0's own value; in
evaluation, where fw's exact shards give ranks unequal numbers of batches, it is refused (a
per-step collective there would hang). One 2-rank Gloo job covers all three, and that fw says
once that it keeps the unshuffled training loader's order (Lightning would shuffle it)."""

from __future__ import annotations

import json

import pytest
from forked import run_script

from .helpers import check_ok, write_script

SCRIPT = """
import json, os, sys
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
import framework as fw
from framework.errors import ConfigError

def make(Base):
    class Model(Base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)
            self.rows = []

        def training_step(self, batch, batch_idx):
            loss = (self.layer(batch[0]) - batch[1]).pow(2).mean()
            own = loss.detach() + 10 * self.global_rank  # each rank's value differs
            self.log("own", own)
            self.log("mean", own, sync_dist=True)
            self.log("max", own, sync_dist=True, reduce_fx="max")
            return loss

        def on_train_batch_end(self, outputs, batch, batch_idx):
            self.rows.append({k: float(self.trainer.callback_metrics[k]) for k in ("own", "mean", "max")})

        def validation_step(self, batch, batch_idx):
            self.log("val_step", batch[1].sum(), on_step=True, sync_dist=True)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)
    return Model

g = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(32, 4, generator=g), torch.randn(32, 1, generator=g))

def train_loader():  # the same shard in both frameworks (Lightning would shuffle an unshuffled loader)
    sampler = DistributedSampler(data, num_replicas=2, rank=int(os.environ["RANK"]), shuffle=False)
    return DataLoader(data, batch_size=4, sampler=sampler)
settings = dict(devices=2, max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                enable_model_summary=False, num_sanity_val_steps=0)
fw.seed_everything(0)
model = make(fw.TrainModule)()
trainer = fw.Trainer(strategy="ddp_gloo", **settings)
trainer.fit(model, DataLoader(data, batch_size=4))
rows = {"fw": model.rows}
try:
    trainer.validate(model, DataLoader(data, batch_size=4))
    refused = None
except ConfigError as err:
    refused = str(err)
rank = trainer.global_rank
fw.seed_everything(0)
model = make(fw.TrainModule)()
fw.Trainer(strategy="ddp_gloo", **settings).fit(model, train_loader())
rows["fw, given sampler"] = model.rows
try:
    import pytorch_lightning as pl
except ImportError:
    pl = None
if pl is not None:  # the same under Lightning's DDP, in the same two processes
    pl.seed_everything(0)
    theirs = make(pl.LightningModule)()
    pl.Trainer(strategy="ddp", accelerator="cpu", **settings).fit(theirs, train_loader())
    rows["lightning"] = theirs.rows
with open(f"{sys.argv[1]}/rank{rank}.json", "w") as f:
    json.dump({"rows": rows, "refused": refused}, f)
"""


@pytest.mark.timeout(30)
def test_step_values_with_sync_dist_are_reduced_over_the_ranks(tmp_path):
    result = run_script(write_script(tmp_path, SCRIPT), str(tmp_path), nprocs=2, timeout=60)
    check_ok(result)
    # fw says once, on rank 0, where it differs from Lightning and the script relies on it
    assert result.output.count("differs from Lightning: an unshuffled training loader keeps its order") == 1
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert len(ranks[0]["rows"]["fw"]) == len(ranks[1]["rows"]["fw"]) == 4
    for mine, theirs in zip(ranks[0]["rows"]["fw"], ranks[1]["rows"]["fw"], strict=True):
        assert theirs["own"] > mine["own"] + 5  # the values really differ between the ranks
        for row in (mine, theirs):
            assert row["mean"] == pytest.approx((mine["own"] + theirs["own"]) / 2, rel=1e-6)
            assert row["max"] == pytest.approx(max(mine["own"], theirs["own"]), rel=1e-6)
    for r in ranks:
        assert "on_step=True, sync_dist=True" in r["refused"] and "on_step=False" in r["refused"]
        if "lightning" in r["rows"]:  # Lightning logs the same numbers
            for ours, theirs in zip(r["rows"]["fw, given sampler"], r["rows"]["lightning"], strict=True):
                assert ours == pytest.approx(theirs, rel=1e-6)
