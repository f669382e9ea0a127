"""``trainer.logged_metrics`` is what went to the loggers (``logger=True``), not
``callback_metrics``: the same module logging the same values gives the same names and values
on fw and on Lightning, after fit and after validate."""

from __future__ import annotations

import pytest
import torch
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


def _run(trainer_cls, base) -> tuple[dict, dict, dict]:
    trainer = trainer_cls(log_every_n_steps=1, logger=False, **QUIET)
    model = _module(base)
    loader = DataLoader(sum_data(24), batch_size=8)
    trainer.fit(model, loader, loader)
    after_fit = {k: float(v) for k, v in trainer.logged_metrics.items()}
    returned = trainer.validate(model, loader, verbose=False)  # what went to the loggers: not val_hidden
    return after_fit, {k: float(v) for k, v in trainer.logged_metrics.items()}, returned[0]


@pytest.mark.timeout(30)
def test_logged_metrics_are_what_lightning_logs():
    ours, theirs = _run(fw.Trainer, fw.TrainModule), _run(pl.Trainer, pl.LightningModule)
    for mine, lightning in zip(ours, theirs, strict=True):
        assert set(mine) == set(lightning), (mine, lightning)
        for name, value in lightning.items():
            assert mine[name] == pytest.approx(value, rel=1e-6), name
    assert "hidden" not in ours[0] and "val_hidden" not in ours[1] and "val_hidden" not in ours[2]


def _epoch_value(trainer_cls, base, **log_args) -> dict:
    class Logs(make_summing(base, lr=0.05)):
        def training_step(self, batch, batch_idx):
            loss = self.mse(batch)
            self.log("loss", loss, on_epoch=True, **log_args)
            return loss

    trainer = trainer_cls(logger=False, **QUIET)
    trainer.fit(Logs(), DataLoader(sum_data(24), batch_size=8))
    return {k: float(v) for k, v in trainer.callback_metrics.items()}


@pytest.mark.parametrize("log_args", [
    dict(reduce_fx=torch.max), dict(reduce_fx=torch.sum), dict(reduce_fx="avg"),
    dict(reduce_fx="Max"), dict(rank_zero_only=True), dict(add_dataloader_idx=False, metric_attribute="m"),
    dict(sync_dist_group=object()),  # no sync_dist: no group to reduce over, in Lightning as in fw
], ids=["torch.max", "torch.sum", "avg", "Max", "rank_zero_only", "dataloader_idx-attribute", "unused-group"])
def test_self_log_takes_lightnings_arguments_with_lightnings_meaning(log_args):
    assert _epoch_value(fw.Trainer, fw.TrainModule, **log_args) == \
        pytest.approx(_epoch_value(pl.Trainer, pl.LightningModule, **log_args), rel=1e-6)


@pytest.mark.parametrize(("log_args", "words"), [
    (dict(reduce_fx=torch.median), "torchmetrics Metric"),
    (dict(enable_graph=True), "enable_graph"),
    (dict(sync_dist=True, sync_dist_group=object()), "sync_dist_group"),
], ids=["median", "enable_graph", "a-group-to-reduce-over"])
def test_what_self_log_cannot_do_is_refused_naming_the_argument(log_args, words):
    from framework.errors import ConfigError

    with pytest.raises(ConfigError, match=words):
        _epoch_value(fw.Trainer, fw.TrainModule, **log_args)
