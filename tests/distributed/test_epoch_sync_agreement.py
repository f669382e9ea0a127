"""Epoch values with ``sync_dist=True`` when the ranks logged different things: a value logged on
rank 0 only is still reduced on both ranks (the other rank joins the reduction with nothing of
its own), and the ranks agree; when every rank logged the same names the epoch end skips the
gather of the other ranks' entries (one small all-reduce says they agree). The second pass over
the epoch's values (for what the epoch-end hooks logged) asks the other ranks nothing where no
rank has such a hook, and runs on every rank where one rank has one. The ranks are forked from
the test process (tests/forked.py): no launcher is under test here."""

from __future__ import annotations

import json

import forked
import pytest

from .helpers import check_ok, write_script

SCRIPT = """
import json, os, sys
import torch
from torch.utils.data import DataLoader, TensorDataset
import framework as fw

class Model(fw.TrainModule):
    def __init__(self, rank0_logs_more=True):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.rank0_logs_more = rank0_logs_more

    def training_step(self, batch, batch_idx):
        loss = (self.layer(batch[0]) - batch[1]).pow(2).mean()
        self.log("everywhere", float(self.global_rank), on_step=False, on_epoch=True, sync_dist=True)
        if self.global_rank == 0 and self.rank0_logs_more:
            self.log("only_rank0", 5.0, on_step=False, on_epoch=True, sync_dist=True, reduce_fx="max")
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

class LogsAtEpochEnd(fw.Callback):  # given to rank 0 only
    def on_train_epoch_end(self, trainer, module):
        module.log("at_end", 7.0, sync_dist=True, reduce_fx="max")

g = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(16, 2, generator=g), torch.randn(16, 1, generator=g))
result = {}
for case in ("differing", "same", "hook_on_rank0"):
    rank0_logs_more = case == "differing"
    callbacks = [LogsAtEpochEnd()] if case == "hook_on_rank0" and os.environ["RANK"] == "0" else []
    trainer = fw.Trainer(accelerator="cpu", devices=2, strategy="ddp_gloo", max_epochs=2, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=callbacks)
    checks, same = [], trainer.strategy.the_same_on_every_rank
    def checked(text, same=same, checks=checks):
        checks.append(text)
        return same(text)
    trainer.strategy.the_same_on_every_rank = checked
    gathers, gather = [], trainer.strategy.all_gather_object
    def counted(obj, gather=gather, gathers=gathers):  # the gathers of the metric entries (the end of a fit gathers RNG states)
        if isinstance(obj, tuple):
            gathers.append(obj)
        return gather(obj)
    trainer.strategy.all_gather_object = counted
    trainer.fit(Model(rank0_logs_more), DataLoader(data, batch_size=4))
    result[case] = {"values": {k: float(v) for k, v in trainer.callback_metrics.items()},
                    "gathers": len(gathers), "checks": len(checks)}

class TwoLoaders(Model):  # loader 1 has one sample: rank 1 runs no batch of it, and joins its sum with nothing
    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        self.log("y", batch[1].sum(), sync_dist=True, reduce_fx="sum")

trainer = fw.Trainer(accelerator="cpu", devices=2, strategy="ddp_gloo", logger=False, enable_progress_bar=False,
                     enable_model_summary=False)
loaders = [DataLoader(TensorDataset(data.tensors[0][:8], data.tensors[1][:8]), batch_size=2),
           DataLoader(TensorDataset(data.tensors[0][8:9], data.tensors[1][8:9]), batch_size=2)]
result["two_loaders"] = {"returned": trainer.validate(TwoLoaders(), loaders, verbose=False),
                         "expected": [float(data.tensors[1][:8].sum()), float(data.tensors[1][8])]}
with open(f"{sys.argv[1]}/rank{trainer.global_rank}.json", "w") as f:
    json.dump(result, f)
"""


@pytest.mark.timeout(75)
def test_a_value_logged_on_one_rank_is_reduced_on_both_and_they_agree(tmp_path):
    check_ok(forked.run_script(write_script(tmp_path, SCRIPT), str(tmp_path), nprocs=2, timeout=60))
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0] == ranks[1]
    differing, same, hook = ranks[0]["differing"], ranks[0]["same"], ranks[0]["hook_on_rank0"]
    assert differing["values"]["everywhere"] == pytest.approx(0.5)  # the mean of rank 0's 0 and rank 1's 1
    assert differing["values"]["only_rank0"] == 5.0
    assert differing["gathers"] == 2  # the entries differed: gathered, once an epoch (2 epochs)
    assert same["gathers"] == 0 and same["values"]["everywhere"] == pytest.approx(0.5)  # agreed: no gather
    assert differing["checks"] == same["checks"] == 2  # no epoch-end hook anywhere: one check an epoch
    # rank 0's hook logged at the epoch's end: both ranks ran the second pass (2 checks an epoch);
    # each pass gathered (the ranks differ in their hooks, then in the entry), rank 1 adopted the
    # entry and joined its reduction
    assert hook["checks"] == 4 and hook["gathers"] == 4 and hook["values"]["at_end"] == 7.0
    # two validation loaders, the second's one sample on rank 0 only: rank 1 adopts its entry
    # (y/dataloader_idx_1, loader 1's) and both return each loader's own sum
    two = ranks[0]["two_loaders"]
    assert [list(d) for d in two["returned"]] == [["y/dataloader_idx_0"], ["y/dataloader_idx_1"]]
    assert [next(iter(d.values())) for d in two["returned"]] == pytest.approx(two["expected"])
