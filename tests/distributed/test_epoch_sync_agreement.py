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
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        loss = (self.layer(batch[0]) - batch[1]).pow(2).mean()
        self.log("everywhere", float(self.global_rank), on_step=False, on_epoch=True, sync_dist=True)
        if self.global_rank == 0:
            self.log("only_rank0", 5.0, on_step=False, on_epoch=True, sync_dist=True, reduce_fx="max")
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

g = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(16, 2, generator=g), torch.randn(16, 1, generator=g))
trainer = fw.Trainer(accelerator="cpu", devices=2, strategy="ddp_gloo", max_epochs=2, logger=False,
                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
trainer.fit(Model(), DataLoader(data, batch_size=4))
values = {k: float(v) for k, v in trainer.callback_metrics.items()}
with open(f"{sys.argv[1]}/rank{trainer.global_rank}.json", "w") as f:
    json.dump(values, f)
"""


@pytest.mark.timeout(40)
def test_a_value_logged_on_one_rank_is_reduced_on_both_and_they_agree(tmp_path):
    check_ok(run_script(write_script(tmp_path, SCRIPT), str(tmp_path), launcher="torchrun", timeout=35))
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0] == ranks[1]
    assert ranks[0]["everywhere"] == pytest.approx(0.5)  # the mean of rank 0's 0 and rank 1's 1
    assert ranks[0]["only_rank0"] == 5.0
