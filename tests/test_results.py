"""What self.log records: epoch means weighted by batch size, metric objects reset per epoch."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics import SumMetric
from toy import QUIET, LinearModel

import framework as fw


class LogsBatchMean(LinearModel):
    """Logs the mean of x in each batch: the epoch value must be the mean over all samples."""

    def training_step(self, batch, batch_idx):
        x, _ = batch
        self.log("x_mean", x.mean(), on_step=True, on_epoch=True)
        self.log("x_max", x.max(), on_epoch=True, reduce_fx="max")
        self.log("n_seen", float(len(x)), on_step=False, on_epoch=True, reduce_fx="sum")
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        x, _ = batch
        self.log("val/x_mean", x.mean())


def test_epoch_mean_is_weighted_by_batch_size():
    x = torch.arange(10, dtype=torch.float32).reshape(10, 1).repeat(1, 4)
    data = TensorDataset(x, torch.zeros(10, 1))
    # batches of 4, 4, 2: an unweighted mean of batch means would be (1.5 + 5.5 + 8.5) / 3 = 5.1667
    trainer = fw.Trainer(max_epochs=1, num_sanity_val_steps=0, **QUIET)
    trainer.fit(LogsBatchMean(), DataLoader(data, batch_size=4), DataLoader(data, batch_size=3))
    metrics = trainer.callback_metrics
    assert torch.isclose(metrics["x_mean_epoch"], torch.tensor(4.5))
    assert torch.isclose(metrics["x_mean"], torch.tensor(4.5))
    assert torch.isclose(metrics["x_mean_step"], torch.tensor(8.5))  # last batch
    assert metrics["x_max"] == 9.0
    assert metrics["n_seen"] == 10.0
    assert torch.isclose(metrics["val/x_mean"], torch.tensor(4.5))  # batches of 3, 3, 3, 1


class CountsWithMetric(LinearModel):
    def __init__(self):
        super().__init__()
        self.seen = SumMetric()
        self.per_epoch = []

    def validation_step(self, batch, batch_idx):
        self.seen.update(torch.ones(len(batch[0])))
        self.log("val/seen", self.seen)

    def on_validation_epoch_end(self):
        self.per_epoch.append(self.seen.update_count)


def test_torchmetric_is_computed_and_reset_each_epoch():
    data = TensorDataset(torch.randn(12, 4), torch.randn(12, 1))
    model = CountsWithMetric()
    trainer = fw.Trainer(max_epochs=3, num_sanity_val_steps=0, **QUIET)
    trainer.fit(model, DataLoader(data, batch_size=4), DataLoader(data, batch_size=5))
    # if the metric were not reset, the value would grow to 36 after 3 epochs
    assert trainer.callback_metrics["val/seen"] == 12.0
    assert model.per_epoch == [3, 3, 3]  # update_count seen before reset, each epoch from zero


def test_progress_bar_metrics_are_floats_of_prog_bar_logs():
    class ProgBar(LinearModel):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            self.log("shown", loss, prog_bar=True)
            self.log("hidden", loss)
            return loss

    data = TensorDataset(torch.randn(8, 4), torch.randn(8, 1))
    trainer = fw.Trainer(max_epochs=1, **QUIET)
    trainer.fit(ProgBar(), DataLoader(data, batch_size=4))
    assert set(trainer.progress_bar_metrics) == {"shown"}
    assert isinstance(trainer.progress_bar_metrics["shown"], float)


def test_metric_logged_per_step_in_training_is_reset_each_epoch():
    class TrainCounts(LinearModel):
        def __init__(self):
            super().__init__()
            self.seen = SumMetric()

        def training_step(self, batch, batch_idx):
            self.seen(torch.ones(len(batch[0])))
            self.log("train/seen_step", self.seen)  # default in training: on_step only
            return super().training_step(batch, batch_idx)

    data = TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
    model = TrainCounts()
    fw.Trainer(max_epochs=3, **QUIET).fit(model, DataLoader(data, batch_size=4))
    assert model.seen.update_count == 0  # reset at the last epoch's end, not 12 updates deep
