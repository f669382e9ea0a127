"""Bugs found in a review of the Trainer's inside, each shown fixed through a real Trainer."""

from __future__ import annotations

import pytest
import torch
import torchmetrics
from toy import QUIET, LinearModel, loader, regression_data

import framework as fw


def test_predict_puts_back_the_training_mode(tmp_path):
    model = LinearModel()
    trainer = fw.Trainer(**QUIET)
    model.train()
    trainer.predict(model, loader(regression_data(8), 4))
    assert model.training
    model.eval()
    trainer.predict(model, loader(regression_data(8), 4))
    assert not model.training


class MetricLogger(LinearModel):
    """Logs a torchmetrics MeanMetric of the targets with default flags in training and
    validation: Lightning gives the step value in training and the epoch value in validation."""

    def __init__(self):
        super().__init__()
        self.train_mean = torchmetrics.MeanMetric()
        self.val_mean = torchmetrics.MeanMetric()
        self.steps: list[float] = []

    def training_step(self, batch, batch_idx):
        self.train_mean(batch[1].mean())
        self.log("train/mean", self.train_mean)
        return super().training_step(batch, batch_idx)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.steps.append(float(self.trainer.callback_metrics["train/mean"]))

    def validation_step(self, batch, batch_idx):
        self.val_mean(batch[1].mean())
        self.log("val/mean", self.val_mean)


def test_a_metric_logged_with_default_flags_steps_in_training_and_aggregates_in_validation():
    data = regression_data(16)
    batch_means = [float(data.tensors[1][i:i + 4].mean()) for i in range(0, 16, 4)]
    model = MetricLogger()
    trainer = fw.Trainer(**QUIET, max_epochs=1, num_sanity_val_steps=0)
    trainer.fit(model, loader(data, 4), loader(data, 4))
    # training_step: each step's own value (the metric's forward), no epoch entry
    assert model.steps == pytest.approx(batch_means)
    assert "train/mean_epoch" not in trainer.callback_metrics
    # validation_step: one value for the epoch (the mean over all batches), no step entries
    assert float(trainer.callback_metrics["val/mean"]) == pytest.approx(sum(batch_means) / 4, abs=1e-6)
    assert not any(k.startswith("val/mean_") for k in trainer.callback_metrics)


def test_callback_metrics_is_one_dict_that_keeps_what_callbacks_write():
    seen = []

    class Writes(fw.Callback):
        def on_train_epoch_end(self, trainer, module):
            trainer.callback_metrics["custom/value"] = torch.tensor(float(trainer.current_epoch))

        def on_train_epoch_start(self, trainer, module):
            seen.append(trainer.callback_metrics.get("custom/value"))

    trainer = fw.Trainer(**QUIET, max_epochs=2, callbacks=[Writes()])
    trainer.fit(LinearModel(), loader(regression_data(8), 4))
    assert seen[0] is None and float(seen[1]) == 0.0
    assert float(trainer.callback_metrics["custom/value"]) == 1.0
    assert trainer.callback_metrics is trainer.callback_metrics
