"""``log_every_n_steps=0``, as Lightning: no step rows at all (the values logged on_step, the
learning rate each step, the device statistics), the epoch rows and evaluation rows as usual."""

from __future__ import annotations

import csv

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import framework as fw
import framework.callbacks  # noqa: F401  (fw.callbacks, as pl.callbacks)
import framework.loggers  # noqa: F401

pl = pytest.importorskip("pytorch_lightning")


def _rows(lib, base: type, root) -> list:
    class Model(base):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            loss = torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])
            self.log("loss", loss, on_step=True, on_epoch=True)
            return loss

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1]))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    g = torch.Generator().manual_seed(0)
    data = DataLoader(TensorDataset(torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g)), batch_size=4)
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
