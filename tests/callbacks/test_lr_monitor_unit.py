"""LearningRateMonitor driven by a real Trainer (a fake Trainer once hid a bug here: its
``callback_metrics`` was a plain dict, the real one a fresh dict on every read)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from toy import QUIET, LinearModel, RecordingLogger, loader, regression_data

import framework as fw
from framework.callbacks import LearningRateMonitor
from framework.errors import ConfigError


class LRRows(RecordingLogger):
    def lr_rows(self, prefix="lr-"):
        """(step, {name: value}) for the rows that hold learning rates."""
        rows = []
        for step, metrics in self.rows:
            lrs = {k: v for k, v in metrics.items() if k.startswith(prefix)}
            if lrs:
                rows.append((step, lrs))
        return rows


class Configurable(LinearModel):
    """LinearModel whose optimizers come from a function given at construction."""

    def __init__(self, make):
        super().__init__()
        self.make = make
        self.head = nn.Linear(1, 1)  # a second parameter group's worth of weights

    def configure_optimizers(self):
        return self.make(self)


def fit(tmp_path, make, callback, batches=3, epochs=1, logger=True, **trainer_args):
    recorder = LRRows() if logger else None
    trainer = fw.Trainer(**{**QUIET, "logger": recorder or False}, default_root_dir=str(tmp_path),
                         max_epochs=epochs, callbacks=[callback], **trainer_args)
    trainer.fit(Configurable(make), loader(regression_data(8 * batches), 8))
    return trainer, recorder


def test_step_scheduler_logged_every_step_and_kept_in_callback_metrics(tmp_path):
    def make(m):
        opt = torch.optim.SGD(m.parameters(), lr=1.0)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    # 2 batches per step (accumulation): each batch of a step logs its rate, as in Lightning
    trainer, recorder = fit(tmp_path, make, LearningRateMonitor(), batches=6, log_every_n_steps=1,
                            accumulate_grad_batches=2)
    assert recorder.lr_rows() == [(step, {"lr-SGD": lr}) for step, lr in ((0, 1.0), (1, 0.5), (2, 0.25)) for _ in "ab"]
    # the real Trainer's callback_metrics keeps what the callback wrote
    assert isinstance(trainer.callback_metrics["lr-SGD"], torch.Tensor)
    assert trainer.callback_metrics["lr-SGD"].item() == 0.25


def test_epoch_interval_names_param_groups_and_momentum(tmp_path):
    def make(m):
        adam = torch.optim.Adam([{"params": m.net.parameters()}, {"params": m.head.parameters(), "lr": 0.1}], lr=0.01)
        sched = torch.optim.lr_scheduler.ExponentialLR(adam, gamma=0.9)
        return {"optimizer": adam, "lr_scheduler": {"scheduler": sched, "interval": "epoch", "name": "backbone"}}

    _, recorder = fit(tmp_path, make, LearningRateMonitor(log_momentum=True), epochs=2, log_every_n_steps=1)
    rows = [stats for _, stats in recorder.rows if "backbone/pg1" in stats]
    assert len(rows) == 2  # once per epoch, at its start; nothing per step
    assert rows[0] == pytest.approx({"backbone/pg1": 0.01, "backbone/pg1-momentum": 0.9,
                                     "backbone/pg2": 0.1, "backbone/pg2-momentum": 0.9})
    assert rows[1]["backbone/pg1"] == pytest.approx(0.009)


class TwoOptimizers(Configurable):
    """Two optimizers need manual optimization, as in Lightning."""

    def __init__(self, make):
        super().__init__(make)
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.manual_backward(loss)
        for opt in self.optimizers():
            opt.step()
            opt.zero_grad()


def test_logging_interval_step_and_duplicate_names(tmp_path):
    def make(m):
        return [torch.optim.SGD(m.net.parameters(), lr=0.1), torch.optim.SGD(m.head.parameters(), lr=0.2)]

    recorder = LRRows()
    trainer = fw.Trainer(**{**QUIET, "logger": recorder}, default_root_dir=str(tmp_path), max_epochs=1,
                         callbacks=[LearningRateMonitor(logging_interval="step")], log_every_n_steps=1)
    trainer.fit(TwoOptimizers(make), loader(regression_data(16), 8))
    assert recorder.lr_rows() == [(0, {"lr-SGD": 0.1, "lr-SGD-1": 0.2}), (1, {"lr-SGD": 0.1, "lr-SGD-1": 0.2})]


def test_honours_log_every_n_steps(tmp_path):
    def make(m):
        return torch.optim.SGD(m.parameters(), lr=0.1)

    _, recorder = fit(tmp_path, make, LearningRateMonitor(logging_interval="step"), batches=5, log_every_n_steps=2)
    assert [step for step, _ in recorder.lr_rows()] == [1, 3]  # Lightning's: before the 2nd and 4th steps


def test_param_group_names_are_used(tmp_path):
    def make(m):
        return torch.optim.SGD([{"params": m.net.parameters(), "name": "enc"},
                                {"params": m.head.parameters(), "name": "dec"}], lr=0.1)

    _, recorder = fit(tmp_path, make, LearningRateMonitor(), log_every_n_steps=1)
    rows = recorder.lr_rows()  # no scheduler: at the epoch's start and at every step row, as in Lightning
    assert rows[0] == (0, {"lr-SGD/enc": 0.1, "lr-SGD/dec": 0.1}) and len(rows) > 1
    assert all(values == rows[0][1] for _, values in rows)


def test_without_logger_warns_but_fills_callback_metrics(tmp_path):
    def make(m):
        return torch.optim.SGD(m.parameters(), lr=0.1)

    with pytest.warns(UserWarning, match="no logger"):
        trainer, _ = fit(tmp_path, make, LearningRateMonitor(), logger=False)
    assert trainer.callback_metrics["lr-SGD"].item() == pytest.approx(0.1)


def test_invalid_interval():
    with pytest.raises(ConfigError, match="did you mean 'step'"):
        LearningRateMonitor(logging_interval="steps")
