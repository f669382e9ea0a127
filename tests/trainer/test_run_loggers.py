"""A run's record is never rewritten by a later call, and a refused call leaves nothing behind
(issue 47, items 2 and 3): an evaluation on a fresh Trainer logs into a version folder of its
own, as in Lightning, never into the fit's (fw logged into the folder its checkpoint came from
and wrote over the fit's ``hparams.yaml``); the loggers write nothing before the checkpoint has
loaded (fw wrote ``hparams.yaml`` and an event file before it found the checkpoint missing, or
of another model; Lightning leaves a folder too)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from lightning.modules import QUIET, regression_loader
from torch import nn

import framework as fw
from framework.errors import CheckpointError

pl = pytest.importorskip("pytorch_lightning")
LIBS = {"fw": (fw, fw.TrainModule), "lightning": (pl, pl.LightningModule)}


def make_sized(Base):
    class Sized(Base):
        """A seeded MLP of width ``hidden`` that logs its loss; a checkpoint of one width does
        not load into another."""

        def __init__(self, hidden: int = 8, lr: float = 0.1) -> None:
            super().__init__()
            self.save_hyperparameters()
            torch.manual_seed(0)
            self.net = nn.Sequential(nn.Linear(4, hidden), nn.Tanh(), nn.Linear(hidden, 1))

        def training_step(self, batch, batch_idx):
            loss = F.mse_loss(self.net(batch[0]), batch[1])
            self.log("loss", loss)
            return loss

        def test_step(self, batch, batch_idx):
            self.log("test_loss", F.mse_loss(self.net(batch[0]), batch[1]))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    return Sized


def _contents(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _trainer(lib, root, **extra):
    return lib.Trainer(**{**QUIET, "max_epochs": 1, "log_every_n_steps": 1, "enable_checkpointing": True, **extra},
                       default_root_dir=str(root), logger=lib.loggers.CSVLogger(str(root), name="logs"))


@pytest.mark.timeout(90)
def test_an_evaluation_on_a_fresh_trainer_logs_into_its_own_version_and_rewrites_nothing_of_the_fit(tmp_path):
    seen = {}
    for name, (lib, Base) in LIBS.items():
        root = tmp_path / name
        fit = _trainer(lib, root)
        fit.fit(make_sized(Base)(hidden=8), regression_loader())
        fitted = _contents(root)
        _trainer(lib, root).test(make_sized(Base)(hidden=8, lr=0.5), regression_loader(),
                                 ckpt_path=fit.checkpoint_callback.best_model_path)
        after = _contents(root)
        assert {k: v for k, v in after.items() if k in fitted} == fitted  # nothing of the fit's rewritten
        seen[name] = sorted(set(after) - set(fitted))
        assert b"lr: 0.5" in after["logs/version_1/hparams.yaml"] and b"lr: 0.5" not in after["logs/version_0/hparams.yaml"]
        assert b"test_loss" in after["logs/version_1/metrics.csv"]
    assert seen["fw"] == seen["lightning"] == ["logs/version_1/hparams.yaml", "logs/version_1/metrics.csv"]


@pytest.mark.timeout(60)
def test_an_evaluation_refused_for_its_checkpoint_writes_nothing(tmp_path):
    """(Lightning's CSVLogger leaves an empty ``version_1/`` here, its TensorBoardLogger an event file.)"""
    fit = _trainer(fw, tmp_path)
    fit.fit(make_sized(fw.TrainModule)(hidden=8), regression_loader())
    fitted = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")), _contents(tmp_path)
    for logger in (lambda: fw.loggers.CSVLogger(str(tmp_path), name="logs"), lambda: True):
        trainer = fw.Trainer(**{**QUIET, "enable_checkpointing": True}, default_root_dir=str(tmp_path), logger=logger())
        with pytest.raises(CheckpointError, match="does not fit this model: size mismatch"):
            trainer.test(make_sized(fw.TrainModule)(hidden=16), regression_loader(),
                         ckpt_path=fit.checkpoint_callback.best_model_path)
        assert (sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")), _contents(tmp_path)) == fitted


@pytest.mark.parametrize("make_file", [None, lambda path: path.write_bytes(b"not a checkpoint")],
                         ids=["missing", "damaged"])
@pytest.mark.timeout(60)
def test_a_fit_refused_for_its_checkpoint_leaves_nothing_behind(make_file, tmp_path):
    """(Lightning 2.6 leaves ``lightning_logs/version_0/`` with an event file here.)"""
    checkpoint = tmp_path / "x.ckpt"
    if make_file is not None:
        make_file(checkpoint)
    before = sorted(os.listdir(tmp_path))
    trainer = fw.Trainer(**{**QUIET, "enable_checkpointing": True}, default_root_dir=str(tmp_path))
    with pytest.raises(CheckpointError, match=r"does not exist|corrupt or truncated"):
        trainer.fit(make_sized(fw.TrainModule)(), regression_loader(), ckpt_path=str(checkpoint))
    assert sorted(os.listdir(tmp_path)) == before  # no fw_logs/version_0 with hparams.yaml and events


@pytest.mark.timeout(90)
def test_a_resumed_fit_writes_its_hyperparameters_beside_the_fits_never_over_them(tmp_path, caplog):
    """Issue 47, item 2: a fit resumed on a new Trainer goes on in its checkpoint's folder and wrote
    its ``hparams.yaml`` over the fit's (there ``lr: 0.05``, the fit's ``config.yaml`` kept 0.1);
    now its hyperparameters are ``hparams-1.yaml``, one file for the two loggers of the folder,
    which a later call of the same Trainer updates. (Lightning resumes into a new version folder.)"""
    Sized = make_sized(fw.TrainModule)

    def trainer(max_epochs):
        return fw.Trainer(**{**QUIET, "max_epochs": max_epochs, "enable_checkpointing": True},
                          default_root_dir=str(tmp_path),
                          logger=[fw.loggers.TensorBoardLogger(str(tmp_path)), fw.loggers.CSVLogger(str(tmp_path))])

    fit = trainer(1)
    fit.fit(Sized(lr=0.1), regression_loader())
    folder = tmp_path / "fw_logs" / "version_0"
    fitted = (folder / "hparams.yaml").read_bytes()
    assert b"lr: 0.1" in fitted
    resumed = trainer(2)
    with caplog.at_level("INFO", logger="framework"):
        resumed.fit(Sized(lr=0.05), regression_loader(), ckpt_path=fit.checkpoint_callback.best_model_path)
    assert resumed.log_dir == str(folder)
    assert (folder / "hparams.yaml").read_bytes() == fitted
    assert b"lr: 0.05" in (folder / "hparams-1.yaml").read_bytes()
    said = [r.getMessage() for r in caplog.records if "hyperparameters are" in r.getMessage()]
    assert said == [f"{folder / 'hparams.yaml'} is an earlier command's record and stays as it is; this run's "
                    "hyperparameters are hparams-1.yaml"]
    resumed.lightning_module.hparams.lr = 0.02  # the same Trainer's next call updates its own file
    resumed.test(resumed.lightning_module, regression_loader())
    assert (folder / "hparams.yaml").read_bytes() == fitted
    assert sorted(p.name for p in folder.glob("hparams*")) == ["hparams-1.yaml", "hparams.yaml"]
