"""Callbacks and loggers driven by the real Trainer: top-k files on disk, early stopping at the
right epoch, TensorBoard event files that hold what was logged, and a light ``import framework``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from conftest import subprocess_env
from toy import LinearModel, loader, regression_data

import framework as fw
from framework.callbacks import EarlyStopping, ModelCheckpoint
from framework.loggers import TensorBoardLogger


class ScriptedMetric(LinearModel):
    """Logs a chosen value per epoch as ``val/score`` (the training itself is real)."""

    def __init__(self, scores):
        super().__init__()
        self.scores = scores

    def validation_step(self, batch, batch_idx):
        self.log("val/score", float(self.scores[self.current_epoch]))


def _trainer(tmp_path, callbacks, epochs, logger=False):
    return fw.Trainer(accelerator="cpu", devices=1, max_epochs=epochs, num_sanity_val_steps=0, logger=logger,
                      enable_progress_bar=False, default_root_dir=str(tmp_path), callbacks=callbacks)


def test_top_k_keeps_the_best_files_on_disk(tmp_path):
    scores = [0.5, 0.9, 0.7, 0.95, 0.6]
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ck", monitor="val/score", mode="max", save_top_k=2,
                           filename="{epoch}-{val/score:.2f}", save_last=True)
    data = regression_data(16)
    _trainer(tmp_path, [ckpt], 5).fit(ScriptedMetric(scores), loader(data, 8), loader(data, 8))
    files = sorted(str(p.relative_to(tmp_path / "ck")) for p in (tmp_path / "ck").rglob("*.ckpt"))
    assert files == ["epoch=1-val/score=0.90.ckpt", "epoch=3-val/score=0.95.ckpt", "last.ckpt"]  # "/": a folder,
    assert ckpt.best_model_path.endswith("epoch=3-val/score=0.95.ckpt")                         # as in Lightning
    assert abs(float(ckpt.best_model_score) - 0.95) < 1e-6  # logged as float32
    best = torch.load(ckpt.best_model_path, weights_only=True)
    assert best["epoch"] == 3 and best["global_step"] == 8


def test_early_stopping_stops_after_patience(tmp_path):
    scores = [1.0, 0.8, 0.81, 0.82, 0.83, 0.5, 0.4]  # best at epoch 1, then 3 epochs without improvement
    stop = EarlyStopping(monitor="val/score", mode="min", patience=3)
    trainer = _trainer(tmp_path, [stop], 7)
    data = regression_data(16)
    trainer.fit(ScriptedMetric(scores), loader(data, 8), loader(data, 8))
    assert trainer.current_epoch == 5  # epochs 0..4 ran
    assert stop.stopped_epoch == 4 and trainer.should_stop


def test_tensorboard_event_files_hold_the_logged_scalars(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = TensorBoardLogger()
    trainer = fw.Trainer(accelerator="cpu", devices=1, max_epochs=2, num_sanity_val_steps=0, logger=logger,
                         log_every_n_steps=1, enable_progress_bar=False, enable_checkpointing=False,
                         default_root_dir=str(tmp_path))
    data = regression_data(32)
    model = LinearModel()
    trainer.fit(model, loader(data, 8), loader(data, 16))
    events = EventAccumulator(logger.log_dir)
    events.Reload()
    tags = events.Tags()["scalars"]
    assert {"train/loss_step", "train/loss_epoch", "val/loss"} <= set(tags)
    steps = [e.step for e in events.Scalars("train/loss_step")]
    assert steps == list(range(0, 8))  # Lightning's labels: the batches that stepped before this one
    final_val = events.Scalars("val/loss")[-1]
    assert final_val.step == 7
    assert abs(final_val.value - float(trainer.callback_metrics["val/loss"])) < 1e-6
    assert str(tmp_path) in logger.log_dir and "version_0" in logger.log_dir


def test_import_framework_stays_light():
    code = ("import sys, framework, framework.trainer, framework.callbacks, framework.loggers; "
            "heavy = [m for m in ('tensorboard', 'rich', 'sklearn', 'mpi4py', 'omegaconf') if m in sys.modules]; "
            "print(heavy); sys.exit(1 if heavy else 0)")
    proc = subprocess.run([sys.executable, "-c", code], env=subprocess_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr



_ATTRIBUTE_CHAIN = """
import json, sys
import {pkg} as top
for name in {names!r}:
    value = top
    for part in name.split("."):
        value = getattr(value, part)
print(json.dumps([m for m in ("tensorboard", "rich", "sklearn", "mpi4py") if m in sys.modules]))
"""


@pytest.mark.timeout(240)  # three fresh interpreters, one importing Lightning: 14 s alone, over 60 s in a loaded suite
def test_subpackages_are_attributes_of_a_fresh_import_as_in_lightning():
    """``fw.callbacks.ModelCheckpoint`` right after ``import framework as fw``, as ``pl.callbacks.ModelCheckpoint``
    after ``import pytorch_lightning as pl`` (fw raised AttributeError until something else imported the
    subpackage); the subpackage is imported on first use, so the import stays light."""
    names = ["callbacks.ModelCheckpoint", "callbacks.EarlyStopping", "loggers.CSVLogger", "profilers.SimpleProfiler"]
    for pkg in ("framework", "pytorch_lightning"):
        code = _ATTRIBUTE_CHAIN.format(pkg=pkg, names=names)
        proc = subprocess.run([sys.executable, "-c", code], env=subprocess_env(), capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, f"{pkg}: {proc.stderr[-2000:]}"
    light = subprocess.run([sys.executable, "-c", _ATTRIBUTE_CHAIN.format(pkg="framework", names=names[:2])],
                           env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert json.loads(light.stdout.splitlines()[-1]) == [], light.stdout
