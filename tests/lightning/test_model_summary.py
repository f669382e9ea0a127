"""``ModelSummary(max_depth=...)``, as Lightning's callback: the same layers (names, types,
parameter counts) at each depth, printed once at the start of a fit in place of the default
summary, also where ``enable_model_summary`` is off; ``max_depth=0`` prints none."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import framework as fw
from framework.callbacks import ModelSummary
from framework.callbacks.model_summary import layer_rows
from framework.errors import ConfigError
from lightning.modules import regression_loader

pl = pytest.importorskip("pytorch_lightning")


def _nested(base: type):
    class Nested(base):
        def __init__(self):
            super().__init__()
            self.encoder = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Sequential(nn.Linear(8, 8), nn.ReLU()))
            self.head = nn.Linear(8, 1)

        def training_step(self, batch, batch_idx):
            return nn.functional.mse_loss(self.head(self.encoder(batch[0])), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Nested


@pytest.mark.parametrize("depth", [1, 2, 3, -1])
def test_the_layers_at_each_depth_are_lightnings(depth):
    from pytorch_lightning.utilities.model_summary import ModelSummary as Summary

    theirs = Summary(_nested(pl.LightningModule)(), max_depth=depth)
    ours = layer_rows(_nested(fw.TrainModule)(), depth)
    assert [(r["name"], r["type"], r["params"]) for r in ours] == list(
        zip(theirs.layer_names, theirs.layer_types, theirs.param_nums, strict=True))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("enable_model_summary", [True, False])
def test_the_callback_prints_one_summary_at_the_fits_start(capsys, enable_model_summary):
    trainer = fw.Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=enable_model_summary,
                         callbacks=[ModelSummary(max_depth=2)])
    trainer.fit(_nested(fw.TrainModule)(), regression_loader())
    err = capsys.readouterr().err
    assert err.count("Nested") == 1 and "encoder.2" in err and "encoder.2.0" not in err


@pytest.mark.timeout(60)
def test_max_depth_0_prints_no_summary_and_a_bad_depth_is_refused(capsys):
    trainer = fw.Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, callbacks=[ModelSummary(max_depth=0)])
    trainer.fit(_nested(fw.TrainModule)(), regression_loader())
    assert "encoder" not in capsys.readouterr().err
    with pytest.raises(ConfigError, match="max_depth"):
        ModelSummary(max_depth=-2)
