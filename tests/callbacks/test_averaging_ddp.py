"""Weight averaging and the Timer on 2 Gloo ranks (one job, three fits): SWA with BatchNorm ends
with the same weights and the same BatchNorm statistics on both ranks (each rank gathers its own
in the BatchNorm epoch; they are averaged over the ranks), EMA with the same weights on both, and
a Timer whose duration is up on rank 0 only stops both ranks at the same batch (rank 0's clock
decides: were each rank to decide alone, rank 1 would train on and wait for rank 0 forever)."""

from __future__ import annotations

import json

import pytest
from distributed.helpers import check_ok, write_script
from forked import run_script

SCRIPT = """
import json, os, sys, time
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
import framework as fw
from framework.callbacks import EMAWeightAveraging, StochasticWeightAveraging, Timer

rank = int(os.environ["RANK"])

class Net(fw.TrainModule):
    def __init__(self, sleep=0.0):
        super().__init__()
        self.sleep = sleep
        self.net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 1))

    def training_step(self, batch, batch_idx):
        time.sleep(self.sleep)
        return F.mse_loss(self.net(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

class OwnStatistics(fw.Callback):  # each rank's BatchNorm mean after the BatchNorm epoch's last batch
    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.state.forward_only and trainer.state.is_last_batch:
            self.mean = module.net[1].running_mean.tolist()

g = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(32, 4, generator=g), torch.randn(32, 1, generator=g))
settings = dict(devices=2, strategy="ddp_gloo", accelerator="cpu", logger=False, enable_checkpointing=False,
                enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
out = {}
def weights(model):
    return {k: v.flatten().tolist() for k, v in model.state_dict().items()}

fw.seed_everything(0)
model, own = Net(), OwnStatistics()
trainer = fw.Trainer(max_epochs=3, callbacks=[StochasticWeightAveraging(0.05, swa_epoch_start=2, annealing_epochs=1), own],
                     **settings)
trainer.fit(model, DataLoader(data, batch_size=4, shuffle=True))
out["swa"] = {"weights": weights(model), "own_mean": own.mean, "epoch": trainer.current_epoch}

fw.seed_everything(0)
model = Net()
trainer = fw.Trainer(max_epochs=2, callbacks=[EMAWeightAveraging(decay=0.8)], **settings)
trainer.fit(model, DataLoader(data, batch_size=4, shuffle=True))
out["ema"] = {"params": {k: v.flatten().tolist() for k, v in model.named_parameters()}, "step": trainer.global_step}

timer = Timer(duration={"seconds": 0.2 if rank == 0 else 1000})
trainer = fw.Trainer(max_epochs=1000, callbacks=[timer], **settings)
trainer.fit(Net(sleep=0.01), DataLoader(data, batch_size=4))
out["timer"] = {"step": trainer.global_step, "reason": trainer.state.stop_reason, "elapsed": timer.time_elapsed()}
with open(f"{sys.argv[1]}/rank{rank}.json", "w") as f:
    json.dump(out, f)
"""


@pytest.mark.timeout(60)
def test_averages_and_the_timers_stop_agree_on_two_gloo_ranks(tmp_path):
    check_ok(run_script(write_script(tmp_path, SCRIPT), str(tmp_path), nprocs=2, timeout=50))
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    assert r0["swa"]["epoch"] == 4  # 3 epochs and the BatchNorm epoch
    assert r0["swa"]["own_mean"] != r1["swa"]["own_mean"]  # each rank gathered its own statistics
    assert r0["swa"]["weights"] == r1["swa"]["weights"]  # parameters and statistics, after the averaging
    mean = [(a + b) / 2 for a, b in zip(r0["swa"]["own_mean"], r1["swa"]["own_mean"], strict=True)]
    assert r0["swa"]["weights"]["net.1.running_mean"] == pytest.approx(mean, rel=1e-6)
    assert r0["ema"]["params"] == r1["ema"]["params"] and r0["ema"]["step"] == 8
    assert r0["timer"]["step"] == r1["timer"]["step"] > 0 and r0["timer"]["step"] < 8000
    assert r0["timer"]["reason"] == r1["timer"]["reason"] == "should_stop"
    assert r1["timer"]["elapsed"] < 1000  # rank 1's own clock was far from its limit
