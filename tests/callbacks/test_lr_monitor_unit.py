"""LearningRateMonitor against a fake Trainer that exposes only the documented interface."""

from dataclasses import dataclass

import pytest
import torch

from framework.callbacks import LearningRateMonitor
from framework.errors import ConfigError


@dataclass
class SchedulerConfig:
    scheduler: object
    interval: str = "epoch"
    frequency: int = 1
    monitor: str | None = None
    name: str | None = None


class FakeTrainer:
    def __init__(self, optimizers, configs=(), loggers=("a logger",)):
        self.optimizers = list(optimizers)
        self.lr_scheduler_configs = list(configs)
        self.loggers = list(loggers)
        self.global_step = 0
        self.callback_metrics = {}
        self.logged = []

    def log_metrics(self, metrics, step):
        self.logged.append((step, dict(metrics)))


def params(n=1):
    return [torch.nn.Parameter(torch.zeros(1)) for _ in range(n)]


def test_step_scheduler_logged_every_step_and_stored_in_callback_metrics():
    opt = torch.optim.SGD(params(), lr=1.0)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    trainer = FakeTrainer([opt], [SchedulerConfig(sched, interval="step")])
    cb = LearningRateMonitor()
    cb.on_train_start(trainer, None)
    cb.on_train_epoch_start(trainer, None)  # no epoch-interval optimizer: nothing
    for step in range(3):
        trainer.global_step = step
        cb.on_train_batch_start(trainer, None, None, step)
        cb.on_train_batch_start(trainer, None, None, step)  # accumulation: same step, logged once
        opt.step()
        sched.step()
    assert trainer.logged == [(0, {"lr-SGD": 1.0}), (1, {"lr-SGD": 0.5}), (2, {"lr-SGD": 0.25})]
    assert isinstance(trainer.callback_metrics["lr-SGD"], torch.Tensor)
    assert trainer.callback_metrics["lr-SGD"].item() == 0.25


def test_epoch_interval_names_param_groups_and_momentum():
    model_params, head_params = params(), params()
    adam = torch.optim.Adam([{"params": model_params}, {"params": head_params, "lr": 0.1}], lr=0.01)
    sgd = torch.optim.SGD(params(), lr=0.5, momentum=0.9)
    sched = torch.optim.lr_scheduler.ExponentialLR(adam, gamma=0.9)
    trainer = FakeTrainer([adam, sgd], [SchedulerConfig(sched, interval="epoch", name="backbone")])
    cb = LearningRateMonitor(log_momentum=True)
    cb.on_train_start(trainer, None)
    cb.on_train_batch_start(trainer, None, None, 0)  # no step-interval scheduler: nothing
    assert trainer.logged == []
    cb.on_train_epoch_start(trainer, None)
    (step, stats), = trainer.logged
    assert stats == pytest.approx({
        "backbone/pg1": 0.01, "backbone/pg1-momentum": 0.9,
        "backbone/pg2": 0.1, "backbone/pg2-momentum": 0.9,
        "lr-SGD": 0.5, "lr-SGD-momentum": 0.9,
    })


def test_logging_interval_overrides_and_duplicate_names():
    a, b = torch.optim.SGD(params(), lr=0.1), torch.optim.SGD(params(), lr=0.2)
    trainer = FakeTrainer([a, b])
    cb = LearningRateMonitor(logging_interval="step")
    cb.on_train_start(trainer, None)
    cb.on_train_epoch_start(trainer, None)
    assert trainer.logged == []
    cb.on_train_batch_start(trainer, None, None, 0)
    assert trainer.logged == [(0, {"lr-SGD": 0.1, "lr-SGD-1": 0.2})]


def test_honours_log_every_n_steps():
    opt = torch.optim.SGD(params(), lr=0.1)
    trainer = FakeTrainer([opt])
    trainer.log_every_n_steps = 2
    cb = LearningRateMonitor(logging_interval="step")
    cb.on_train_start(trainer, None)
    for step in range(5):
        trainer.global_step = step
        cb.on_train_batch_start(trainer, None, None, step)
    assert [s for s, _ in trainer.logged] == [0, 2, 4]


def test_param_group_names_are_used():
    opt = torch.optim.SGD([{"params": params(), "name": "enc"}, {"params": params(), "name": "dec"}], lr=0.1)
    trainer = FakeTrainer([opt])
    cb = LearningRateMonitor()
    cb.on_train_start(trainer, None)
    cb.on_train_epoch_start(trainer, None)
    assert trainer.logged == [(0, {"lr-SGD/enc": 0.1, "lr-SGD/dec": 0.1})]


def test_without_logger_warns_but_fills_callback_metrics():
    trainer = FakeTrainer([torch.optim.SGD(params(), lr=0.1)], loggers=())
    cb = LearningRateMonitor()
    with pytest.warns(UserWarning, match="no logger"):
        cb.on_train_start(trainer, None)
    cb.on_train_epoch_start(trainer, None)
    assert trainer.callback_metrics["lr-SGD"].item() == pytest.approx(0.1)


def test_invalid_interval():
    with pytest.raises(ConfigError, match="did you mean 'step'"):
        LearningRateMonitor(logging_interval="steps")
