"""Loggers as Lightning's, found by a side-by-side sweep (fw and pytorch_lightning on the same
module): two CSVLoggers of one folder write ``version_0`` and ``version_1`` (fw gave both
``version_0``: one folder, their rows mixed in one file); TensorBoardLogger takes Lightning's
arguments in Lightning's order (``log_graph``, ``prefix``, ``sub_dir``, the writer's keyword
arguments), writes into ``sub_dir`` while checkpoints stay in the version folder, and leaves an
``hparams.yaml`` also where no hyperparameters were saved."""

from __future__ import annotations

import inspect
import os
from pathlib import Path

import pytest

import framework as fw
import framework.callbacks  # fw.callbacks
import framework.loggers as fw_loggers
from framework.errors import ConfigError
from lightning.modules import QUIET, make_regressor, regression_loader

pl = pytest.importorskip("pytorch_lightning")


def _files(root) -> list[str]:
    """Every file under ``root`` (relative), less TensorBoard's event files' names and fw's index."""
    found = []
    for folder, _, names in os.walk(root):
        for name in names:
            if not name.startswith("."):
                name = "events" if name.startswith("events.out.tfevents") else name
                found.append(os.path.relpath(os.path.join(folder, name), root))
    return sorted(found)


def _logged(Base):
    class Logged(make_regressor(Base)):
        def training_step(self, batch, batch_idx):
            loss = self.mse(batch)
            self.log("loss", loss)
            return loss

    return Logged()


@pytest.mark.timeout(60)
def test_two_csv_loggers_of_one_folder_write_two_versions_as_in_lightning(tmp_path):
    seen = {}
    for lib, loggers in ((fw, fw_loggers), (pl, pl.loggers)):
        root = tmp_path / lib.__name__
        both = [loggers.CSVLogger(root, name="logs"), loggers.CSVLogger(root, name="logs")]
        lib.Trainer(**{**QUIET, "max_epochs": 1, "log_every_n_steps": 1}, logger=both).fit(
            _logged(fw.TrainModule if lib is fw else pl.LightningModule), regression_loader())
        rows = [len(Path(lg.log_dir, "metrics.csv").read_text().splitlines()) for lg in both]
        seen[lib.__name__] = ([lg.version for lg in both], rows)
    assert seen["framework"] == seen["pytorch_lightning"] == ([0, 1], [5, 5])


@pytest.mark.timeout(60)
def test_tensorboard_logger_takes_lightnings_arguments_and_writes_where_lightnings_does(tmp_path):
    assert list(inspect.signature(fw_loggers.TensorBoardLogger).parameters) == \
        list(inspect.signature(pl.loggers.TensorBoardLogger).parameters)
    seen = {}
    for lib, loggers, base in ((fw, fw_loggers, fw.TrainModule), (pl, pl.loggers, pl.LightningModule)):
        root = tmp_path / lib.__name__
        logger = loggers.TensorBoardLogger(root, name="tb", version=None, log_graph=False, default_hp_metric=True,
                                           prefix="p", sub_dir="inner", flush_secs=5)
        trainer = lib.Trainer(**{**QUIET, "max_epochs": 1, "log_every_n_steps": 1, "enable_checkpointing": True},
                              logger=logger)
        trainer.fit(_logged(base), regression_loader())
        seen[lib.__name__] = (_files(root), os.path.relpath(trainer.log_dir, root),
                              os.path.relpath(trainer.checkpoint_callback.dirpath, os.path.realpath(root)),
                              Path(logger.log_dir, "hparams.yaml").read_text())
    assert seen["framework"] == seen["pytorch_lightning"]
    assert seen["framework"][:3] == (["tb/version_0/checkpoints/epoch=0-step=4.ckpt", "tb/version_0/inner/events",
                                      "tb/version_0/inner/hparams.yaml"], "tb/version_0/inner",
                                     "tb/version_0/checkpoints")
    with pytest.raises(ConfigError, match="log_graph"):
        fw_loggers.TensorBoardLogger(tmp_path, log_graph=True)


@pytest.mark.timeout(60)
def test_a_logged_step_or_epoch_is_the_rows_and_the_checkpoints_as_in_lightning(tmp_path):
    # Lightning: a value logged as "step" is the logger's step for that row, one logged as "epoch"
    # the row's epoch, and both name the checkpoint (fw kept its own counters and dropped them)
    seen = {}
    for lib, loggers, base in ((fw, fw_loggers, fw.TrainModule), (pl, pl.loggers, pl.LightningModule)):
        class OwnCounters(make_regressor(base)):
            def training_step(self, batch, batch_idx):
                loss = self.mse(batch)
                self.log("step", float(10 * (self.global_step + 1)))
                self.log("loss", loss)
                return loss

            def on_train_epoch_end(self):
                self.log("epoch", float(100 + self.current_epoch))

        root = tmp_path / lib.__name__
        logger = loggers.CSVLogger(root, name="csv")
        trainer = lib.Trainer(**{**QUIET, "max_epochs": 2, "log_every_n_steps": 1, "enable_checkpointing": True},
                              logger=logger)
        trainer.fit(OwnCounters(), regression_loader())
        with open(os.path.join(logger.log_dir, "metrics.csv")) as f:
            lines = f.read().splitlines()
        header = lines[0].split(",")
        rows = [dict(zip(header, line.split(","), strict=True)) for line in lines[1:]]
        seen[lib.__name__] = ([(float(r["step"]), r["epoch"], bool(r.get("loss"))) for r in rows],
                              os.path.basename(trainer.checkpoint_callback.best_model_path))
    assert seen["framework"] == seen["pytorch_lightning"]
    assert seen["framework"][1] == "epoch=101-step=80.ckpt"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sub_dir", ["inner/", "deeper/inner", "ABSOLUTE"])
def test_checkpoints_stay_in_the_version_folder_whatever_the_sub_dir(tmp_path, sub_dir):
    sub_dir = str(tmp_path / "elsewhere") if sub_dir == "ABSOLUTE" else sub_dir
    logger = fw_loggers.TensorBoardLogger(tmp_path, name="tb", sub_dir=sub_dir)
    trainer = fw.Trainer(**{**QUIET, "max_epochs": 1, "enable_checkpointing": True}, logger=logger)
    trainer.fit(_logged(fw.TrainModule), regression_loader())
    assert os.path.dirname(trainer.checkpoint_callback.best_model_path) == \
        os.path.realpath(tmp_path / "tb" / "version_0" / "checkpoints")


@pytest.mark.timeout(60)
def test_two_loggers_whose_folder_is_not_their_versions_are_left_as_they_are(tmp_path):
    class Fixed(fw_loggers.Logger):  # a user's logger: one folder whatever the version
        @property
        def log_dir(self) -> str:
            return str(tmp_path / "fixed")

        def log_metrics(self, metrics, step):
            pass

        def log_hyperparams(self, params):
            pass

    trainer = fw.Trainer(**{**QUIET, "max_epochs": 1}, logger=[Fixed(tmp_path), Fixed(tmp_path)])
    trainer.fit(_logged(fw.TrainModule), regression_loader())  # set-up used to loop forever here
    assert trainer.global_step == 4


def test_format_checkpoint_name_takes_lightnings_arguments_in_its_order():
    metrics = {"epoch": 1, "step": 2}
    for callbacks in (fw.callbacks, pl.callbacks):
        checkpoint = callbacks.ModelCheckpoint(dirpath="/ck")
        assert checkpoint.format_checkpoint_name(metrics, "last", 1) == "/ck/last-v1.ckpt"
