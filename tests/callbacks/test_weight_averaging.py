"""StochasticWeightAveraging and EMAWeightAveraging with the real Trainer: a fit stopped and
resumed from a checkpoint written while averaging (mid-epoch, with SWALR in place of the module's
StepLR; and inside SWA's BatchNorm epoch) ends with the weights, BatchNorm statistics and learning
rate of the fit never stopped, bit for bit; the arguments and set-ups they cannot serve are refused.
(Beside Lightning's: tests/lightning/test_weight_averaging.py; under DDP: test_averaging_ddp.py.)"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from toy import QUIET, LinearModel, loader, regression_data

import framework as fw
from framework.callbacks import EMAWeightAveraging, ModelCheckpoint, StochasticWeightAveraging
from framework.checkpointing.file import load_checkpoint
from framework.errors import ConfigError


class BatchNormNet(fw.TrainModule):
    """An MLP with BatchNorm, SGD with momentum, an epoch StepLR, validation."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 1))

    def training_step(self, batch, batch_idx):
        return F.mse_loss(self.net(batch[0]), batch[1])

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", F.mse_loss(self.net(batch[0]), batch[1]))

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 1, 0.7)}


class SaveInBatchNormEpoch(fw.Callback):
    """Writes a checkpoint after the 3rd batch of SWA's BatchNorm epoch (which steps no optimizer)."""

    def __init__(self, path):
        self.path = path

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.state.forward_only and batch_idx == 2:
            trainer.save_checkpoint(self.path)


def _fit(averager, ckpt_path=None, savers=()) -> dict:
    fw.seed_everything(5)
    model = BatchNormNet()
    data = regression_data(40)
    trainer = fw.Trainer(**{**QUIET, "enable_checkpointing": bool(savers)}, max_epochs=4, num_sanity_val_steps=0,
                         callbacks=[averager, *savers])
    trainer.fit(model, loader(data, 8, shuffle=True), loader(data, 20), ckpt_path=ckpt_path)
    return {"state": {k: v.clone() for k, v in model.state_dict().items()}, "step": trainer.global_step,
            "epoch": trainer.current_epoch, "lr": trainer.optimizers[0].param_groups[0]["lr"]}


def _swa():
    return StochasticWeightAveraging(swa_lrs=0.05, swa_epoch_start=2, annealing_epochs=2)


def _assert_same(a: dict, b: dict) -> None:
    assert (a["step"], a["epoch"], a["lr"]) == (b["step"], b["epoch"], b["lr"])
    for key, value in a["state"].items():
        assert torch.equal(value, b["state"][key]), key


@pytest.mark.timeout(60)
def test_swa_resumed_mid_averaging_and_inside_the_batch_norm_epoch_ends_bit_identical(tmp_path):
    mid, in_bn = tmp_path / "step=12.ckpt", tmp_path / "in_bn.ckpt"
    every = ModelCheckpoint(dirpath=tmp_path, filename="{step}", every_n_train_steps=12, save_top_k=-1)
    straight = _fit(_swa(), savers=(every, SaveInBatchNormEpoch(in_bn)))
    assert straight["epoch"] == 5 and straight["step"] == 20  # 4 epochs of 5 steps, then the BatchNorm epoch
    state = load_checkpoint(mid)
    assert state["loop"]["epoch"] == 2 and state["loop"]["batches_done"] == 2  # mid-epoch, while averaging
    swa_state = state["callbacks"]["StochasticWeightAveraging"]
    assert swa_state["n_averaged"] == 2 and swa_state["scheduler_state"]["_step_count"] == 2
    assert len(state["lr_schedulers"]) == 1 and "gamma" in state["lr_schedulers"][0]  # the module's StepLR
    assert load_checkpoint(in_bn)["callbacks"]["StochasticWeightAveraging"]["bn_update_started"]
    for path in (mid, in_bn):
        _assert_same(_fit(_swa(), ckpt_path=str(path)), straight)
    # the check has teeth: a fit that drops the average's state on resume ends elsewhere
    forgetful = _swa()
    forgetful.load_state_dict = lambda state: None
    assert not torch.equal(_fit(forgetful, ckpt_path=str(mid))["state"]["net.0.weight"], straight["state"]["net.0.weight"])


@pytest.mark.timeout(60)
def test_ema_resumed_mid_epoch_ends_bit_identical(tmp_path):
    every = ModelCheckpoint(dirpath=tmp_path, filename="{step}", every_n_train_steps=7, save_top_k=-1)
    straight = _fit(EMAWeightAveraging(decay=0.8), savers=(every,))
    checkpoint = load_checkpoint(tmp_path / "step=7.ckpt")
    assert int(checkpoint["averaging_state"]["n_averaged"]) == 7
    assert not torch.equal(checkpoint["state_dict"]["net.0.weight"], checkpoint["current_model_state"]["net.0.weight"])
    _assert_same(_fit(EMAWeightAveraging(decay=0.8), ckpt_path=str(tmp_path / "step=7.ckpt")), straight)


def test_validation_sees_the_average_and_training_goes_on_with_the_module_weights():
    seen = {}

    class Probe(fw.Callback):  # after the EMA callback: sees what it swapped
        def note(self, hook, module):
            seen[hook] = (module.net.weight.detach().clone(), ema._average_model.module.net.weight.detach().clone())

        def on_validation_epoch_start(self, trainer, module):
            self.note("validation", module)

        def on_train_epoch_end(self, trainer, module):
            self.note("epoch end", module)

    ema = EMAWeightAveraging(decay=0.5)
    model = LinearModel()
    fw.Trainer(**QUIET, max_epochs=1, num_sanity_val_steps=0, callbacks=[ema, Probe()]).fit(
        model, loader(regression_data(16), 8), loader(regression_data(16), 8))
    (validated, kept_aside), (trained, average) = seen["validation"], seen["epoch end"]
    assert torch.equal(validated, average) and torch.equal(kept_aside, trained)  # swapped in, then back
    assert not torch.equal(validated, trained)
    assert torch.equal(model.net.weight, average)  # the fit ends with the module holding the average


def test_what_they_refuse():
    for kwargs, match in [(dict(swa_lrs=-1.0), r"swa_lrs=-1.0\) must be a positive float"),
                          (dict(swa_lrs=0.1, swa_epoch_start=0), r"swa_epoch_start=0\) must be an int >= 1"),
                          (dict(swa_lrs=0.1, swa_epoch_start=1.5), r"or a float in \[0, 1\]"),
                          (dict(swa_lrs=0.1, annealing_strategy="cosine"), r"must be 'cos' or 'linear' \(did you mean 'cos'\?\)")]:
        with pytest.raises(ConfigError, match=match):
            StochasticWeightAveraging(**kwargs)
    with pytest.raises(ConfigError, match=r"decay=1.5\) must be in \[0, 1\]"):
        EMAWeightAveraging(decay=1.5)

    class TwoSchedulers(LinearModel):
        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=0.1)
            return [opt], [torch.optim.lr_scheduler.StepLR(opt, 1), torch.optim.lr_scheduler.StepLR(opt, 2)]

    class Manual(LinearModel):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, batch, batch_idx):
            self.optimizers().step()

    for model, match in [(TwoSchedulers(), "replaces 1 scheduler; configure_optimizers\\(\\) returned 2"),
                         (Manual(), "needs automatic optimization")]:
        with pytest.raises(ConfigError, match=match):
            fw.Trainer(**QUIET, max_epochs=1, callbacks=[StochasticWeightAveraging(0.1)]).fit(
                model, loader(regression_data(16), 8))
    with pytest.raises(ConfigError, match=r"swa_epoch_start=0.8\) is a fraction of max_epochs, which is -1"):
        fw.Trainer(**QUIET, max_steps=2, callbacks=[StochasticWeightAveraging(0.1)]).fit(
            LinearModel(), loader(regression_data(16), 8))
