"""``trainer.logged_metrics`` is what went to the loggers (``logger=True``), not
``callback_metrics``: the same module logging the same values gives the same names and values
on fw and on Lightning, after fit and after validate."""

from __future__ import annotations

import pytest
from torch import nn
from torch.utils.data import DataLoader

import framework as fw
from lightning.modules import QUIET, make_summing, sum_data

pl = pytest.importorskip("pytorch_lightning")


def _module(base: type) -> nn.Module:
    class Logs(make_summing(base, lr=0.05)):
        def training_step(self, batch, batch_idx):
            loss = self.mse(batch)
            self.log("logged", loss)
            self.log("hidden", loss * 2, logger=False, prog_bar=True)
            self.log("both", loss * 3, on_step=True, on_epoch=True)
            return loss

        def validation_step(self, batch, batch_idx):
            self.log("val_logged", self.mse(batch))
            self.log("val_hidden", 1.0, logger=False)

    return Logs()


def _run(trainer_cls, base) -> tuple[dict, dict]:
    trainer = trainer_cls(log_every_n_steps=1, logger=False, **QUIET)
    model = _module(base)
    loader = DataLoader(sum_data(24), batch_size=8)
    trainer.fit(model, loader, loader)
    after_fit = {k: float(v) for k, v in trainer.logged_metrics.items()}
    trainer.validate(model, loader, verbose=False)
    return after_fit, {k: float(v) for k, v in trainer.logged_metrics.items()}


@pytest.mark.timeout(30)
def test_logged_metrics_are_what_lightning_logs():
    ours, theirs = _run(fw.Trainer, fw.TrainModule), _run(pl.Trainer, pl.LightningModule)
    for mine, lightning in zip(ours, theirs, strict=True):
        assert set(mine) == set(lightning), (mine, lightning)
        for name, value in lightning.items():
            assert mine[name] == pytest.approx(value, rel=1e-6), name
    assert "hidden" not in ours[0] and "val_hidden" not in ours[1]
