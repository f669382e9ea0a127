"""Epoch values with ``sync_dist=True`` when the ranks logged different things: a value logged on
rank 0 only is still reduced on both ranks (the other rank joins the reduction with nothing of
its own), and the ranks agree; when every rank logged the same names the epoch end skips the
gather of the other ranks' entries (one small all-reduce says they agree)."""

from __future__ import annotations

import json

import pytest

from .helpers import check_ok, run_script, write_script

SCRIPT = """
import json, sys
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

g = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(16, 2, generator=g), torch.randn(16, 1, generator=g))
result = {}
for rank0_logs_more in (True, False):
    trainer = fw.Trainer(accelerator="cpu", devices=2, strategy="ddp_gloo", max_epochs=2, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    gathers, gather = [], trainer.strategy.all_gather_object
    def counted(obj, gather=gather, gathers=gathers):  # the gathers of the metric entries (the end of a fit gathers RNG states)
        if isinstance(obj, tuple):
            gathers.append(obj)
        return gather(obj)
    trainer.strategy.all_gather_object = counted
    trainer.fit(Model(rank0_logs_more), DataLoader(data, batch_size=4))
    result[str(rank0_logs_more)] = {"values": {k: float(v) for k, v in trainer.callback_metrics.items()},
                                    "gathers": len(gathers)}
with open(f"{sys.argv[1]}/rank{trainer.global_rank}.json", "w") as f:
    json.dump(result, f)
"""


@pytest.mark.timeout(75)
def test_a_value_logged_on_one_rank_is_reduced_on_both_and_they_agree(tmp_path):
    check_ok(run_script(write_script(tmp_path, SCRIPT), str(tmp_path), launcher="torchrun", timeout=60))
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0] == ranks[1]
    differing, same = ranks[0]["True"], ranks[0]["False"]
    assert differing["values"]["everywhere"] == pytest.approx(0.5)  # the mean of rank 0's 0 and rank 1's 1
    assert differing["values"]["only_rank0"] == 5.0
    assert differing["gathers"] > 0  # the entries differed: gathered
    assert same["gathers"] == 0 and same["values"]["everywhere"] == pytest.approx(0.5)  # agreed: no gather
