"""One counter for "every N steps": ``self.log``'s step rows, ThroughputMonitor and
StepTimeBreakdown land on the same steps, and those are the steps Lightning's ``self.log`` rows
and its ThroughputMonitor land on (with gradient accumulation, where the counts used to part)."""

from __future__ import annotations

import pytest
from torch import nn
from torch.utils.data import DataLoader

import framework as fw
from framework.callbacks import StepTimeBreakdown, ThroughputMonitor
from lightning.modules import QUIET, make_summing, sum_data

pl = pytest.importorskip("pytorch_lightning")

SETTINGS = dict(accumulate_grad_batches=2, log_every_n_steps=4, **QUIET)


def _module(base: type) -> nn.Module:
    class Net(make_summing(base, lr=0.01)):
        def training_step(self, batch, batch_idx):
            loss = self.mse(batch)
            self.log("loss", loss)
            return loss

    return Net()


class LightningRecorder(pl.loggers.Logger):
    """Lightning's rows as they reach a logger: ``(step, metrics)``."""

    name, version = "rec", 0

    def __init__(self) -> None:
        super().__init__()
        self.rows: list = []

    def log_metrics(self, metrics, step=None):
        self.rows.append((step, dict(metrics)))

    def log_hyperparams(self, *args, **kwargs):
        pass


def _loader() -> DataLoader:
    return DataLoader(sum_data(36), batch_size=2)  # 18 batches, 9 steps an epoch


def _steps(rows: list[tuple[int, dict]], prefix: str) -> list[int]:
    return sorted({step for step, metrics in rows if any(k.startswith(prefix) for k in metrics)})


@pytest.mark.timeout(60)
def test_self_log_throughput_and_step_time_land_on_the_same_steps_as_lightnings():
    from toy import RecordingLogger

    fw_logger = RecordingLogger()
    trainer = fw.Trainer(logger=fw_logger, callbacks=[ThroughputMonitor(batch_size_fn=len), StepTimeBreakdown()],
                         **SETTINGS)
    trainer.fit(_module(fw.TrainModule), _loader())
    logged = _steps(fw_logger.rows, "loss")
    assert logged == [3, 7, 11, 15]  # Lightning's _batches_that_stepped before the 4th, 8th, ... step
    assert _steps(fw_logger.rows, "throughput/") == logged
    assert _steps(fw_logger.rows, "step_time/") == logged

    pl_logger = LightningRecorder()
    lightning = pl.Trainer(logger=pl_logger, callbacks=[pl.callbacks.ThroughputMonitor(batch_size_fn=len,
                                                                                       window_size=2)], **SETTINGS)
    lightning.fit(_module(pl.LightningModule), _loader())
    assert _steps(pl_logger.rows, "loss") == logged
    assert _steps(pl_logger.rows, "train/") == logged  # Lightning's throughput keys


@pytest.mark.timeout(60)
def test_a_validation_after_a_batch_that_only_accumulates_logs_at_lightnings_step():
    """Validation every 3 batches, a step every 2: the validations after batches 3 and 9 follow
    batches that only accumulated, whose steps Lightning never counts."""
    from toy import RecordingLogger

    class Validated(make_summing(fw.TrainModule, lr=0.01)):
        def training_step(self, batch, batch_idx):
            return self.mse(batch)

        def validation_step(self, batch, batch_idx):
            self.log("val", self.mse(batch))

    settings = {**SETTINGS, "val_check_interval": 3, "max_epochs": 1}
    ours = RecordingLogger()
    fw.Trainer(logger=ours, **settings).fit(Validated(), _loader(), _loader())

    class LightningValidated(make_summing(pl.LightningModule, lr=0.01)):
        training_step, validation_step = Validated.training_step, Validated.validation_step

    theirs = LightningRecorder()
    pl.Trainer(logger=theirs, **settings).fit(LightningValidated(), _loader(), _loader())
    assert _steps(ours.rows, "val") == _steps(theirs.rows, "val") == [1, 2, 4, 5, 7, 8]
