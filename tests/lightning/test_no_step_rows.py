"""``log_every_n_steps=0``, as Lightning: no step rows at all (the values logged on_step, the
learning rate each step, the device statistics), the epoch rows and evaluation rows as usual."""

from __future__ import annotations

import csv

import pytest

import framework as fw
import framework.callbacks  # fw.callbacks, as pl.callbacks
import framework.loggers
from lightning.modules import make_regressor, regression_loader

pl = pytest.importorskip("pytorch_lightning")


def _rows(lib, base: type, root) -> list:
    class Model(make_regressor(base)):
        def training_step(self, batch, batch_idx):
            loss = self.mse(batch)
            self.log("loss", loss, on_step=True, on_epoch=True)
            return loss

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", self.mse(batch))

    data = regression_loader()
    logger = lib.loggers.CSVLogger(str(root), "logs", 0)
    trainer = lib.Trainer(accelerator="cpu", max_epochs=2, log_every_n_steps=0, logger=logger,
                          enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                          num_sanity_val_steps=0, callbacks=[lib.callbacks.LearningRateMonitor(logging_interval="step"),
                                                   lib.callbacks.DeviceStatsMonitor(cpu_stats=True)])
    trainer.fit(Model(), data, data)
    with open(logger.log_dir + "/metrics.csv", newline="") as f:
        return sorted(tuple(sorted((k, round(float(v), 6)) for k, v in row.items() if v)) for row in csv.DictReader(f))


@pytest.mark.timeout(60)
def test_log_every_n_steps_0_writes_no_step_rows_as_in_lightning(tmp_path):
    ours, theirs = _rows(fw, fw.TrainModule, tmp_path / "fw"), _rows(pl, pl.LightningModule, tmp_path / "pl")
    assert ours == theirs
    assert not any(key in ("loss_step", "lr-SGD") for row in ours for key, _ in row)
    assert sum(1 for row in ours if dict(row).get("loss_epoch") is not None) == 2
