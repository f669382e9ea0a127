"""A URL is not a folder (issue 47, item 11; issue 50, item 3): the outputs that may live in object
storage take an fsspec URL and write through fsspec (tests/storage); the other paths take a local
path or a ``file://`` URL and refuse any other ``scheme://`` in one line naming the key, before
anything is created (``os.makedirs("s3://bucket/run")`` made a local folder named ``s3:``); a
scheme whose back end is not installed is one line naming the key and the package."""

from __future__ import annotations

import os

import pytest
import torch
from lightning.modules import QUIET, make_regressor, regression_loader

import framework as fw
import framework.callbacks as fw_callbacks
import framework.loggers as fw_loggers
import framework.profilers as fw_profilers
from framework.errors import ConfigError
from framework.paths import local_path


@pytest.mark.parametrize(("given", "local"), [
    ("runs/x", "runs/x"), ("/tmp/a b/x.ckpt", "/tmp/a b/x.ckpt"), ("C:/runs/x", "C:/runs/x"),
    ("file:///tmp/run", "/tmp/run"), ("file://localhost/tmp/run", "/tmp/run"), ("file:///tmp/a%20b", "/tmp/a b"),
    ("epoch=1-step=2.ckpt", "epoch=1-step=2.ckpt"),
])
def test_local_paths_and_file_urls_are_local_paths(given, local):
    assert local_path(given, "key") == local
    assert local_path(os.fspath(given), "key") == local


@pytest.mark.parametrize(("url", "named"), [
    ("s3://bucket/run", "object storage (s3://)"), ("gs://b/x", "object storage (gs://)"),
    ("az://c/x", "object storage (az://)"), ("hdfs://nn:8020/x", "object storage (hdfs://)"),
    ("https://host/x.ckpt", "object storage (https://)"), ("file://otherhost/x", "a file on host 'otherhost'"),
])
def test_any_other_scheme_is_refused_in_one_line_naming_the_key(url, named):
    with pytest.raises(ConfigError) as err:
        local_path(url, "trainer.default_root_dir")
    message = str(err.value)
    assert message.startswith(f"trainer.default_root_dir='{url}': {named} is not supported here"), message
    assert "\n" not in message and "local path" in message


def _fit(**trainer):
    return lambda: fw.Trainer(**{**QUIET, "max_epochs": 1}, **trainer).fit(
        make_regressor(fw.TrainModule)(), regression_loader())


def _fit_from(ckpt_path):
    return lambda: fw.Trainer(**{**QUIET, "max_epochs": 1}, logger=fw_loggers.CSVLogger("logs")).fit(
        make_regressor(fw.TrainModule)(), regression_loader(), ckpt_path=ckpt_path)


def _test_from(ckpt_path):
    return lambda: fw.Trainer(**QUIET).test(make_regressor(fw.TrainModule)(), regression_loader(), ckpt_path=ckpt_path)


def _save_to(path):
    def save():
        trainer = fw.Trainer(**{**QUIET, "max_epochs": 1})
        trainer.fit(make_regressor(fw.TrainModule)(), regression_loader())
        for name in os.listdir("."):  # what the fit wrote (nothing with QUIET): only the save is under test
            raise AssertionError(f"the fit wrote {name}")
        trainer.save_checkpoint(path)
    return save


@pytest.mark.parametrize(("key", "call"), [
    ("SimpleProfiler dirpath", lambda: fw_profilers.SimpleProfiler(dirpath="s3://bucket/prof", filename="p")),
])
def test_a_path_that_stays_local_refuses_a_url_before_creating_anything(key, call, tmp_path):
    assert os.getcwd() == str(tmp_path)  # conftest: every test runs in its own empty folder
    with pytest.raises(ConfigError, match=f"^{key}='[a-z0-9]+://bucket/[^']+': object storage .* not supported here"):
        call()
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(("key", "call"), [
    ("trainer.default_root_dir", lambda: fw.Trainer(default_root_dir="gs://bucket/run")),
    ("ModelCheckpoint dirpath", lambda: fw_callbacks.ModelCheckpoint(dirpath="gs://bucket/ck")),
    ("CSVLogger save_dir", lambda: fw_loggers.CSVLogger(save_dir="az://bucket/logs")),
    ("PredictionWriter output_dir", lambda: fw_callbacks.PredictionWriter(output_dir="gs://bucket/out")),
    ("TensorBoardLogger save_dir", lambda: fw_loggers.TensorBoardLogger(save_dir="gs://bucket/logs")),
    ("ckpt_path", _fit_from("gs://bucket/last.ckpt")),
    ("ckpt_path", _test_from("gs://bucket/last.ckpt")),
    ("save_checkpoint filepath", _save_to("gs://bucket/x.ckpt")),
    ("checkpoint_path", lambda: make_regressor(fw.TrainModule).load_from_checkpoint("az://bucket/x.ckpt")),
])
def test_a_url_whose_back_end_is_missing_is_one_line_naming_the_key(key, call, tmp_path):
    """gcsfs and adlfs are not installed here: the key, the URL and the package to install."""
    pytest.importorskip("fsspec")
    for package in ("gcsfs", "adlfs"):
        if __import__("importlib").util.find_spec(package) is not None:
            pytest.skip(f"{package} is installed")
    with pytest.raises(ConfigError, match=f"^{key}='(gs|az)://bucket/[^']+': reading and writing (gs|az):// needs a "
                                          "package that is missing; .*(gcsfs|adlfs)"):
        call()
    assert os.listdir(tmp_path) == []


@pytest.mark.timeout(60)
def test_a_file_url_writes_where_its_path_points_as_in_lightning(tmp_path):
    pl = pytest.importorskip("pytorch_lightning")
    written, weights = {}, {}
    for lib in (fw, pl):
        root = tmp_path / lib.__name__
        trainer = lib.Trainer(**{**QUIET, "max_epochs": 1, "enable_checkpointing": True, "logger": False},
                              default_root_dir=f"file://{root}")
        trainer.fit(make_regressor(fw.TrainModule if lib is fw else pl.LightningModule)(), regression_loader())
        written[lib.__name__] = sorted(str(p.relative_to(root)) for p in root.rglob("*.ckpt"))
        weights[lib.__name__] = trainer.lightning_module.layer.weight.detach().clone()
    assert written["framework"] == written["pytorch_lightning"] == ["checkpoints/epoch=0-step=4.ckpt"]
    assert torch.equal(weights["framework"], weights["pytorch_lightning"])

    # fw's TensorBoard events go there too (Lightning's go to a local folder named 'file:'), and a
    # checkpoint is read back from a file:// URL
    root = tmp_path / "tensorboard"
    class Logged(make_regressor(fw.TrainModule)):
        def training_step(self, batch, batch_idx):
            self.log("loss", loss := self.mse(batch))
            return loss

    fw.Trainer(**{**QUIET, "max_epochs": 1, "enable_checkpointing": True, "log_every_n_steps": 1},
               default_root_dir=f"file://{root}").fit(Logged(), regression_loader())
    assert list(root.glob("fw_logs/version_0/events.out.tfevents.*")) and not list(tmp_path.rglob("file:"))
    loaded = make_regressor(fw.TrainModule).load_from_checkpoint(f"file://{root}/fw_logs/version_0/checkpoints/"
                                                                 "epoch=0-step=4.ckpt")
    assert torch.equal(loaded.layer.weight, weights["framework"])
