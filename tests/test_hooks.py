"""Hooks and module properties during a run (the order of every hook call, beside Lightning's, is
in tests/lightning/test_hook_calls.py)."""

from __future__ import annotations

import pytest
import torch
from toy import QUIET, LinearModel, loader, regression_data

import framework as fw
from framework.callbacks import Callback


class Recorder(Callback):
    def __init__(self, calls):
        self.calls = calls

    def __getattribute__(self, name):
        attr = object.__getattribute__(self, name)
        if name.startswith(("on_", "setup", "teardown")) and callable(attr):
            calls = object.__getattribute__(self, "calls")

            def record(*args, **kwargs):
                calls.append(f"cb.{name}")
                return attr(*args, **kwargs)

            return record
        return attr


# override every hook on the class so the dispatcher calls each one
for _name in [n for n in vars(Callback) if n.startswith(("on_", "setup", "teardown"))]:
    setattr(Recorder, _name, lambda self, *a, **k: None)


def test_exception_reaches_on_exception_and_keeps_traceback():
    calls: list[str] = []

    class Failing(LinearModel):
        def training_step(self, batch, batch_idx):
            raise ValueError("boom in user code")

    trainer = fw.Trainer(max_epochs=1, callbacks=[Recorder(calls)], **QUIET)
    with pytest.raises(ValueError, match="boom in user code") as err:  # the user's error propagates
        trainer.fit(Failing(), loader(regression_data(16)))
    assert err.value.__traceback__ is not None
    assert calls[-1] == "cb.on_exception" and "cb.teardown" not in calls  # Lightning's: no teardown hooks


def test_module_properties_during_fit():
    seen = {}

    class Peek(LinearModel):
        def on_train_batch_end(self, outputs, batch, batch_idx):
            seen.update(epoch=self.current_epoch, step=self.global_step, rank=self.global_rank,
                        device=self.device, trainer=self.trainer)

    trainer = fw.Trainer(max_epochs=2, **QUIET)
    trainer.fit(Peek(), loader(regression_data(16)))
    assert seen == {"epoch": 1, "step": 4, "rank": 0, "device": torch.device("cpu"), "trainer": trainer}
    assert trainer.global_step == 4 and trainer.current_epoch == 2
    assert trainer.world_size == 1 and trainer.is_global_zero


def test_save_hyperparameters_records_init_args():
    model = LinearModel(features=4, lr=0.25, optimizer="adam")
    assert model.hparams == {"features": 4, "lr": 0.25, "optimizer": "adam", "scheduler": None}
