import os
import sys

import pytest
import torch
import yaml

from framework.loggers import Logger, TensorBoardLogger


def _scalars(log_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(log_dir)
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_scalars_are_written_at_their_steps(tmp_path):
    logger = TensorBoardLogger(save_dir=tmp_path, name="exp")
    logger.log_metrics({"train/loss": 1.5, "lr": torch.tensor(0.1)}, step=0)
    logger.log_metrics({"train/loss": 0.75}, step=10)
    logger.log_metrics({"val/acc": 0.5}, step=10)
    logger.finalize("success")

    assert logger.log_dir == os.path.join(str(tmp_path), "exp", "version_0")
    scalars = _scalars(logger.log_dir)
    assert scalars["train/loss"] == [(0, 1.5), (10, 0.75)]
    assert scalars["val/acc"] == [(10, 0.5)]
    assert scalars["lr"][0][0] == 0 and scalars["lr"][0][1] == pytest.approx(0.1)


def test_versions_increment_and_explicit_version(tmp_path):
    first = TensorBoardLogger(save_dir=tmp_path)
    first.log_metrics({"a": 1.0}, step=0)
    first.finalize("success")
    second = TensorBoardLogger(save_dir=tmp_path)
    second.log_metrics({"a": 1.0}, step=0)
    second.finalize("success")
    assert (first.version, second.version) == (0, 1)
    assert second.log_dir.endswith(os.path.join("fw_logs", "version_1"))
    assert TensorBoardLogger(save_dir=tmp_path).version == 2
    assert TensorBoardLogger(save_dir=tmp_path, version=7).log_dir.endswith("version_7")
    assert TensorBoardLogger(save_dir=tmp_path, version="run-a").log_dir.endswith(os.path.join("fw_logs", "run-a"))


def test_version_is_resolved_once_and_nothing_is_created_before_a_write(tmp_path):
    logger = TensorBoardLogger(save_dir=tmp_path)
    assert logger.version == 0
    (tmp_path / "fw_logs" / "version_0").mkdir(parents=True)
    assert logger.version == 0  # not re-resolved
    lazy = TensorBoardLogger(save_dir=tmp_path / "other")
    _ = lazy.log_dir
    assert not (tmp_path / "other").exists()


def test_set_default_root_only_when_no_save_dir_given(tmp_path):
    logger = TensorBoardLogger()
    logger.set_default_root(str(tmp_path / "root"))
    assert logger.save_dir == str(tmp_path / "root")
    given = TensorBoardLogger(save_dir=tmp_path / "mine")
    given.set_default_root(str(tmp_path / "root"))
    assert given.save_dir == str(tmp_path / "mine")


def test_hparams_yaml_and_hparams_summary(tmp_path):
    logger = TensorBoardLogger(save_dir=tmp_path, default_hp_metric=True)
    logger.log_hyperparams({"lr": 0.01, "model": {"hidden": 128, "act": "relu"}, "obj": object})
    logger.log_hyperparams({"seed": 3})
    logger.finalize("success")

    with open(os.path.join(logger.log_dir, "hparams.yaml")) as f:
        saved = yaml.safe_load(f)
    assert saved["lr"] == 0.01 and saved["model"] == {"hidden": 128, "act": "relu"} and saved["seed"] == 3
    assert isinstance(saved["obj"], str)
    assert _scalars(logger.log_dir)["hp_metric"] == [(0, -1.0), (0, -1.0)]  # at each call, as Lightning's
    # Everything lives in this version's folder: no add_hparams sub-run folder.
    assert [p for p in os.listdir(logger.log_dir) if os.path.isdir(os.path.join(logger.log_dir, p))] == []


def test_hparams_from_omegaconf(tmp_path):
    from omegaconf import OmegaConf

    logger = TensorBoardLogger(save_dir=tmp_path)
    logger.log_hyperparams(OmegaConf.create({"a": {"b": 1}, "c": "${a.b}"}))
    logger.finalize("success")
    with open(os.path.join(logger.log_dir, "hparams.yaml")) as f:
        assert yaml.safe_load(f) == {"a": {"b": 1}, "c": 1}


def test_non_scalar_tensor_is_refused(tmp_path):
    logger = TensorBoardLogger(save_dir=tmp_path)
    with pytest.raises(ValueError, match="scalar"):
        logger.log_metrics({"x": torch.ones(3)}, step=0)
    logger.finalize("failed")


def test_logging_after_finalize_reopens_a_writer(tmp_path):
    logger = TensorBoardLogger(save_dir=tmp_path)
    logger.log_metrics({"a": 1.0}, step=0)
    logger.finalize("success")
    logger.log_metrics({"a": 2.0}, step=1)
    logger.finalize("success")
    assert _scalars(logger.log_dir)["a"] == [(0, 1.0), (1, 2.0)]


def test_is_a_logger_and_import_is_lazy():
    assert issubclass(TensorBoardLogger, Logger)
    import subprocess

    code = ("import sys, framework.loggers; "
            "framework.loggers.TensorBoardLogger(save_dir='x'); "
            "assert 'tensorboard' not in sys.modules and 'torch.utils.tensorboard' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_loggers_given_a_default_root_share_one_version_folder(tmp_path):
    from framework.loggers import CSVLogger

    (tmp_path / "fw_logs" / "version_0").mkdir(parents=True)
    tb, csv_logger = TensorBoardLogger(), CSVLogger()
    for lg in (tb, csv_logger):  # what the Trainer does, before any logger writes
        lg.set_default_root(str(tmp_path))
    csv_logger.log_hyperparams({"a": 1})  # creates version_1 on disk
    tb.log_metrics({"x": 1.0}, step=0)
    tb.finalize("success")
    assert tb.log_dir == csv_logger.log_dir == os.path.join(str(tmp_path), "fw_logs", "version_1")
