"""fw's StochasticWeightAveraging and EMAWeightAveraging beside Lightning 2.6's: the same module
(written once for both base classes), data, seed and arguments give the same weights bit for bit,
the same metrics (validation sees the averaged model) and the same state in a checkpoint.

The SWA runs use SGD with momentum and a StepLR that SWALR replaces, a shuffled loader (its own
order in both: ``use_distributed_sampler=False``) and validation every epoch; with BatchNorm the
extra epoch that recomputes the statistics runs too. The one difference, by design: Lightning
counts one more optimizer step in that epoch (its global_step ends one higher and its SWALR steps
once more; without validation that step also moves its weights off the average, by the last
training batch's gradients, which fw never does)."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import framework as fw
from framework.callbacks import EMAWeightAveraging, StochasticWeightAveraging

pytestmark = pytest.mark.skipif(importlib.util.find_spec("pytorch_lightning") is None,
                                reason="pytorch_lightning is not installed (a test-only dependency: "
                                       "pip install -e '.[dev]')")


def make_model(Base, batch_norm: bool):
    class Model(Base):
        def __init__(self):
            super().__init__()
            middle = [nn.BatchNorm1d(8)] if batch_norm else []
            self.net = nn.Sequential(nn.Linear(4, 8), *middle, nn.Tanh(), nn.Linear(8, 1))

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = F.mse_loss(self(x), y)
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", F.mse_loss(self(x), y))

        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
            return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 1, 0.7)}

    return Model


class WeightsAtEpochEnd(fw.Callback):
    def __init__(self):
        self.weights = {}

    def on_train_epoch_end(self, trainer, module):
        self.weights[trainer.current_epoch] = module.net[0].weight.detach().clone()


def _fit(which: str, batch_norm: bool, callback, tmp_path, probe=None) -> dict:
    if which == "lightning":
        import pytorch_lightning as pl
        base, trainer_cls, seed = pl.LightningModule, pl.Trainer, pl.seed_everything
    else:
        base, trainer_cls, seed = fw.TrainModule, fw.Trainer, fw.seed_everything
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(40, 4, generator=g), torch.randn(40, 1, generator=g))
    seed(1)
    model = make_model(base, batch_norm)()
    trainer = trainer_cls(max_epochs=5, callbacks=[callback] + ([probe] if probe else []), logger=False, enable_checkpointing=False,
                          enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1,
                          use_distributed_sampler=False)
    trainer.fit(model, DataLoader(data, batch_size=8, shuffle=True), DataLoader(data, batch_size=16))
    path = tmp_path / f"{which}.ckpt"
    trainer.save_checkpoint(path)
    return {"state": {k: v.clone() for k, v in model.state_dict().items()}, "step": trainer.global_step,
            "params": [name for name, _ in model.named_parameters()],
            "epoch": trainer.current_epoch, "max_epochs": trainer.max_epochs,
            "lr": trainer.optimizers[0].param_groups[0]["lr"],
            "metrics": {k: float(v) for k, v in trainer.callback_metrics.items()},
            "checkpoint": torch.load(path, weights_only=False)}


def _same_tensors(ours: dict, theirs: dict) -> None:
    assert ours.keys() == theirs.keys()
    for key, value in theirs.items():
        assert ours[key].dtype == value.dtype and torch.equal(ours[key], value), key


@pytest.mark.parametrize("batch_norm", [False, True], ids=["plain", "batch_norm"])
def test_swa_gives_lightnings_weights_bit_for_bit(batch_norm, tmp_path):
    import pytorch_lightning.callbacks as pl_callbacks
    arguments = dict(swa_lrs=0.05, swa_epoch_start=2, annealing_epochs=2)
    theirs = _fit("lightning", batch_norm, pl_callbacks.StochasticWeightAveraging(**arguments), tmp_path)
    probe = WeightsAtEpochEnd()
    ours = _fit("fw", batch_norm, StochasticWeightAveraging(**arguments), tmp_path, probe)
    _same_tensors(ours["state"], theirs["state"])
    assert ours["metrics"] == theirs["metrics"] and ours["lr"] == theirs["lr"] == 0.05
    assert ours["epoch"] == theirs["epoch"] == 5 + batch_norm  # the BatchNorm epoch
    assert ours["max_epochs"] == theirs["max_epochs"] == 5  # put back at the end
    assert ours["step"] == 25 and theirs["step"] == 25 + batch_norm  # Lightning's extra step (module docstring)
    mine, lightning = (r["checkpoint"]["callbacks"]["StochasticWeightAveraging"] for r in (ours, theirs))
    assert mine["n_averaged"] == lightning["n_averaged"] == 4 and mine["latest_update_epoch"] == lightning[
        "latest_update_epoch"] == 4
    for name in ours["params"]:  # its buffers: Lightning's are the copy's first ones, torch's the module's latest
        assert torch.equal(mine["average_model_state"][name], lightning["average_model_state"][name]), name
    for key in ("_last_lr", "anneal_epochs"):
        assert mine["scheduler_state"][key] == lightning["scheduler_state"][key], key
    # Lightning's extra step in the BatchNorm epoch steps its SWALR once more too
    assert mine["scheduler_state"]["_step_count"] + batch_norm == lightning["scheduler_state"]["_step_count"] == 5 + batch_norm
    # the average is not the last epoch's weights: the comparison is of averaged models
    assert not torch.equal(probe.weights[4], ours["state"]["net.0.weight"])


def test_ema_gives_lightnings_weights_metrics_and_checkpoint_bit_for_bit(tmp_path):
    import pytorch_lightning.callbacks as pl_callbacks
    theirs = _fit("lightning", True, pl_callbacks.EMAWeightAveraging(decay=0.9), tmp_path)
    ours = _fit("fw", True, EMAWeightAveraging(decay=0.9), tmp_path)
    _same_tensors(ours["state"], theirs["state"])  # parameters and the averaged BatchNorm statistics
    assert ours["metrics"] == theirs["metrics"] and ours["step"] == theirs["step"] == 25
    for key in ("state_dict", "current_model_state", "averaging_state"):
        _same_tensors(ours["checkpoint"][key], theirs["checkpoint"][key])
    assert int(ours["checkpoint"]["averaging_state"]["n_averaged"]) == 25
    mine, lightning = (r["checkpoint"]["callbacks"]["EMAWeightAveraging"] for r in (ours, theirs))
    assert mine == lightning == {"latest_update_step": 25}
