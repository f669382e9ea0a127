"""ModelCheckpoint as Lightning's, run side by side with pytorch_lightning in this process on the
same seed and data: which weights ``ckpt_path="best"`` / ``"last"`` load after a fit (when the
checkpoints were saved)."""

from __future__ import annotations

import importlib.util
import os
import warnings

import pytest
import torch

import framework as fw
from framework.callbacks import ModelCheckpoint
from framework.errors import CheckpointError
from lightning.modules import make_boring

pytestmark = pytest.mark.skipif(importlib.util.find_spec("pytorch_lightning") is None,
                                reason="pytorch_lightning is not installed (pip install pytorch-lightning; "
                                       "a test-only dependency)")

QUIET = dict(accelerator="cpu", devices=1, enable_progress_bar=False, enable_model_summary=False,
             log_every_n_steps=1)


def _lib(which: str):
    if which == "fw":
        return fw, fw.TrainModule, ModelCheckpoint, fw.Callback
    import pytorch_lightning as pl

    return pl, pl.LightningModule, pl.callbacks.ModelCheckpoint, pl.Callback


def _trainer(which: str, root, checkpoint: dict | None = None, **kwargs):
    lib, _, ModelCheckpoint, _ = _lib(which)
    callbacks = [ModelCheckpoint(**checkpoint)] if checkpoint is not None else []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's tips about its cloud services
        return lib.Trainer(default_root_dir=str(root), callbacks=callbacks, **{**QUIET, **kwargs})


def _fit_then_test(which: str, root, ckpt_path: str, checkpoint: dict | None, **kwargs) -> dict:
    lib, Base, _, _ = _lib(which)
    lib.seed_everything(7)
    model = make_boring(Base)()  # 16 steps an epoch, validation data of 5 batches
    trainer = _trainer(which, root, checkpoint, logger=False, **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model)
        fit = {k: float(v) for k, v in trainer.callback_metrics.items()}
        tested = trainer.test(model, ckpt_path=ckpt_path, verbose=False)
    loaded = torch.load(trainer.ckpt_path, weights_only=False)
    return {"fit": fit, "test": tested, "file": os.path.basename(trainer.ckpt_path), "step": loaded["global_step"]}


@pytest.mark.parametrize("ckpt_path, checkpoint, trainer_kwargs", [
    # the default ModelCheckpoint under validation every 5 batches: saved after the last validation
    ("best", None, dict(max_epochs=1, check_val_every_n_epoch=None, val_check_interval=5)),
    ("last", dict(save_last=True), dict(max_epochs=1, check_val_every_n_epoch=None, val_check_interval=5)),
    ("best", dict(monitor="valid_loss"), dict(max_epochs=1, check_val_every_n_epoch=None, val_check_interval=5)),
    # a training metric monitored at each validation's end (4 times an epoch)
    ("best", dict(monitor="train_loss"), dict(max_epochs=1, val_check_interval=0.25)),
    # validation every second epoch: the epoch without it saves nothing
    ("best", None, dict(max_epochs=3, check_val_every_n_epoch=2)),
    ("last", dict(save_last=True), dict(max_epochs=3, check_val_every_n_epoch=2)),
    # validation once an epoch: saved at the training epoch's end, as before
    ("best", dict(monitor="valid_loss", save_last=True), dict(max_epochs=2)),
], ids=["best-every-5", "last-every-5", "monitored-every-5", "train-metric-quarters", "best-every-2nd-epoch",
        "last-every-2nd-epoch", "monitored-every-epoch"])
def test_ckpt_path_loads_the_checkpoint_lightning_loads(tmp_path, ckpt_path, checkpoint, trainer_kwargs):
    ours = _fit_then_test("fw", tmp_path / "fw", ckpt_path, checkpoint, **trainer_kwargs)
    theirs = _fit_then_test("lightning", tmp_path / "pl", ckpt_path, checkpoint, **trainer_kwargs)
    assert ours["fit"] == theirs["fit"]  # the fit itself is Lightning's...
    assert (ours["file"], ours["step"]) == (theirs["file"], theirs["step"])  # ...and so is what it saved when
    assert ours["test"] == theirs["test"]


def test_best_without_any_save_point_is_refused_as_lightning_refuses_it(tmp_path):
    """One epoch, validation every second epoch: no save point came, so there is no "best"."""
    for which, error in (("fw", CheckpointError), ("lightning", ValueError)):
        lib, Base, _, _ = _lib(which)
        lib.seed_everything(7)
        model = make_boring(Base)()
        trainer = _trainer(which, tmp_path / which, logger=False, max_epochs=1, check_val_every_n_epoch=2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(model)
            with pytest.raises(error, match="best"):
                trainer.test(model, ckpt_path="best", verbose=False)
