"""The order in which the Trainer calls module and callback hooks."""

from __future__ import annotations

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


class RecordingModel(LinearModel):
    def __init__(self, calls):
        super().__init__()
        object.__setattr__(self, "calls", calls)


for _name in ["on_fit_start", "on_fit_end", "on_train_start", "on_train_end", "on_train_epoch_start",
              "on_train_epoch_end", "on_train_batch_start", "on_train_batch_end", "on_before_backward",
              "on_after_backward", "on_before_optimizer_step", "on_validation_epoch_start",
              "on_validation_epoch_end"]:
    setattr(RecordingModel, _name, (lambda n: lambda self, *a: self.calls.append(f"m.{n}"))(_name))


def test_fit_hook_order():
    calls: list[str] = []
    trainer = fw.Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=1, num_sanity_val_steps=1,
                         callbacks=[Recorder(calls)], **QUIET)
    data = regression_data(32)
    trainer.fit(RecordingModel(calls), loader(data), loader(data))
    # callbacks before the module, as in Lightning; at epoch ends the module first, so that what
    # it logs there is in the metrics that checkpointing and early stopping read
    batch = ["cb.on_train_batch_start", "m.on_train_batch_start",
             "cb.on_before_backward", "m.on_before_backward",
             "cb.on_after_backward", "m.on_after_backward",
             "cb.on_before_optimizer_step", "m.on_before_optimizer_step",
             "cb.on_train_batch_end", "m.on_train_batch_end"]
    validation = ["cb.on_validation_start", "cb.on_validation_epoch_start", "m.on_validation_epoch_start",
                  "cb.on_validation_batch_start", "cb.on_validation_batch_end",
                  "m.on_validation_epoch_end", "cb.on_validation_epoch_end", "cb.on_validation_end"]
    expected = (
        ["cb.setup", "cb.on_fit_start", "m.on_fit_start", "cb.on_sanity_check_start"] + validation
        + ["cb.on_sanity_check_end", "cb.on_train_start", "m.on_train_start",
           "cb.on_train_epoch_start", "m.on_train_epoch_start"]
        + batch + batch + validation
        + ["m.on_train_epoch_end", "cb.on_train_epoch_end", "cb.on_train_end", "m.on_train_end",
           "cb.on_fit_end", "m.on_fit_end", "cb.teardown"]
    )
    assert calls == expected


def test_exception_reaches_on_exception_and_keeps_traceback():
    calls: list[str] = []

    class Failing(LinearModel):
        def training_step(self, batch, batch_idx):
            raise ValueError("boom in user code")

    trainer = fw.Trainer(max_epochs=1, callbacks=[Recorder(calls)], **QUIET)
    try:
        trainer.fit(Failing(), loader(regression_data(16)))
    except ValueError as err:
        assert "boom in user code" in str(err)
        assert err.__traceback__ is not None
    else:
        raise AssertionError("the user's error must propagate")
    assert "cb.on_exception" in calls and calls[-1] == "cb.teardown"


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
