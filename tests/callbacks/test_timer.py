"""Timer with the real Trainer: a tiny duration ends the fit through ``should_stop`` (after a batch,
or at an epoch's end), the stages' times are measured, and the training time carries over a
checkpoint: a fit resumed with its time already up stops before it trains. (On 2 ranks, both stop
at the same batch: test_averaging_ddp.py.)"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from toy import QUIET, LinearModel, loader, regression_data

import framework as fw
from framework.callbacks import Timer
from framework.checkpointing.file import load_checkpoint
from framework.errors import ConfigError


class Slow(LinearModel):
    def training_step(self, batch, batch_idx):
        time.sleep(0.01)
        return super().training_step(batch, batch_idx)


def _fit(timer, ckpt_path=None, **trainer_args):
    trainer = fw.Trainer(**QUIET, max_epochs=1000, num_sanity_val_steps=0, callbacks=[timer], **trainer_args)
    data = regression_data(32)
    trainer.fit(Slow(), loader(data, 8), loader(data, 16), ckpt_path=ckpt_path)
    return trainer


def test_a_tiny_duration_stops_the_fit_after_a_batch_and_the_times_are_measured(tmp_path):
    timer = Timer(duration=timedelta(seconds=0.3))
    trainer = _fit(timer)
    assert trainer.state.stop_reason == "should_stop" and trainer.should_stop
    assert 0 < trainer.global_step < 100 and trainer.current_epoch < 1000
    assert 0.3 <= timer.time_elapsed("train") < 5 and timer.time_remaining() <= 0
    assert timer.start_time("train") < timer.end_time("train")
    assert timer.time_elapsed("validate") > 0 and timer.start_time("test") is None and timer.time_elapsed("test") == 0
    # the training time carries over a checkpoint: resumed, its time is up before the first batch
    trainer.save_checkpoint(tmp_path / "t.ckpt")
    saved = load_checkpoint(tmp_path / "t.ckpt")["callbacks"]["Timer"]["time_elapsed"]
    assert set(saved) == {"train", "sanity_check", "validate", "test", "predict"} and saved["train"] >= 0.3
    again = Timer(duration=timedelta(seconds=0.3))
    resumed = _fit(again, ckpt_path=str(tmp_path / "t.ckpt"))
    assert resumed.global_step == trainer.global_step  # not one more batch
    assert again.time_elapsed() >= saved["train"]
    # with time left after the resume it trains on
    longer = _fit(Timer(duration={"seconds": saved["train"] + 0.2}), ckpt_path=str(tmp_path / "t.ckpt"))
    assert longer.global_step > trainer.global_step


def test_interval_epoch_stops_at_an_epochs_end():
    trainer = _fit(Timer(duration=timedelta(seconds=0.02), interval="epoch"))
    assert trainer.current_epoch == 1 and trainer.global_step == 4  # 4 batches of 0.01 s: past 0.02 s at the end


def test_durations_and_what_is_refused():
    assert Timer("01:02:03:04")._duration == 93784 and Timer({"minutes": 2})._duration == 120
    assert Timer(timedelta(hours=1))._duration == 3600 and Timer().time_remaining() is None
    for duration in ("1:2:3", "00:00:00:xx", {"fortnights": 1}):
        with pytest.raises(ConfigError, match=r"Timer\(duration="):
            Timer(duration)
    with pytest.raises(ConfigError, match=r"Timer\(interval='steps'\) must be 'step' or 'epoch' \(did you mean 'step'\?\)"):
        Timer(interval="steps")
    with pytest.raises(ConfigError, match=r"unknown stage 'training'"):
        Timer().time_elapsed("training")
