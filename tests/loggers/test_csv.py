import csv
import os

import pytest
import yaml

from framework.errors import ConfigError
from framework.loggers import CSVLogger


def _read(path):
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return reader.fieldnames, list(reader)


def test_rows_and_growing_columns(tmp_path):
    logger = CSVLogger(save_dir=tmp_path, name="exp", flush_logs_every_n_steps=2)
    logger.log_metrics({"train/loss": 1.0}, step=0)
    logger.log_metrics({"train/loss": 0.5}, step=1)  # flushes: header step,train/loss
    assert _read(logger.metrics_file_path)[0] == ["step", "train/loss"]
    logger.log_metrics({"val/acc": 0.9, "train/loss": 0.25}, step=2)  # new key: file rewritten
    logger.finalize("success")

    header, rows = _read(os.path.join(str(tmp_path), "exp", "version_0", "metrics.csv"))
    assert header == ["step", "train/loss", "val/acc"]
    assert rows == [
        {"step": "0", "train/loss": "1.0", "val/acc": ""},
        {"step": "1", "train/loss": "0.5", "val/acc": ""},
        {"step": "2", "train/loss": "0.25", "val/acc": "0.9"},
    ]


def test_buffered_until_flush_or_save(tmp_path):
    logger = CSVLogger(save_dir=tmp_path, flush_logs_every_n_steps=100)
    logger.log_metrics({"a": 1.0}, step=0)
    assert not os.path.exists(logger.metrics_file_path)
    logger.save()
    assert _read(logger.metrics_file_path)[1] == [{"step": "0", "a": "1.0"}]
    logger.save()  # nothing new: file unchanged
    assert len(_read(logger.metrics_file_path)[1]) == 1


def test_resume_into_existing_version_appends(tmp_path):
    first = CSVLogger(save_dir=tmp_path, version=0)
    first.log_metrics({"a": 1.0}, step=0)
    first.finalize("success")
    second = CSVLogger(save_dir=tmp_path, version=0)
    second.log_metrics({"a": 2.0}, step=1)
    second.log_metrics({"b": 3.0}, step=2)
    second.finalize("success")
    header, rows = _read(second.metrics_file_path)
    assert header == ["step", "a", "b"]
    assert [r["step"] for r in rows] == ["0", "1", "2"]


def test_versions_and_hparams(tmp_path):
    first = CSVLogger(save_dir=tmp_path)
    first.log_hyperparams({"lr": 0.1, "opt": {"name": "sgd"}})
    second = CSVLogger(save_dir=tmp_path)
    assert (first.version, second.version) == (0, 1)
    with open(os.path.join(first.log_dir, "hparams.yaml")) as f:
        assert yaml.safe_load(f) == {"lr": 0.1, "opt": {"name": "sgd"}}


def test_no_name_puts_versions_in_save_dir(tmp_path):
    logger = CSVLogger(save_dir=tmp_path, name="")
    assert logger.log_dir == os.path.join(str(tmp_path), "version_0")


def test_bad_flush_interval():
    with pytest.raises(ConfigError, match="flush_logs_every_n_steps"):
        CSVLogger(flush_logs_every_n_steps=0)


@pytest.mark.timeout(60)
def test_a_prefix_names_the_columns_as_lightnings_does(tmp_path):
    """``CSVLogger(prefix=...)``, in Lightning's place among the arguments: the same columns and rows
    as Lightning's from the same fit (fw keeps the columns in the order they came; README)."""
    import inspect

    import framework as fw
    from lightning.modules import make_regressor, regression_loader

    pl = pytest.importorskip("pytorch_lightning")
    assert list(inspect.signature(CSVLogger).parameters)[:5] == list(
        inspect.signature(pl.loggers.CSVLogger).parameters)[:5]

    def fit(lib, base):
        class Model(make_regressor(base)):
            def training_step(self, batch, batch_idx):
                loss = self.mse(batch)
                self.log("loss", loss, on_epoch=True)
                return loss

        data = regression_loader()
        logger = lib.loggers.CSVLogger(str(tmp_path / lib.__name__), "logs", 0, "run")
        lib.Trainer(accelerator="cpu", max_epochs=2, log_every_n_steps=1, logger=logger, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False).fit(Model(), data)
        with open(logger.log_dir + "/metrics.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        return sorted(rows[0]), sorted(tuple(sorted((k, round(float(v), 6)) for k, v in row.items() if v)) for row in rows)

    ours, theirs = fit(fw, fw.TrainModule), fit(pl, pl.LightningModule)
    assert ours == theirs
    assert ours[0] == ["run-epoch", "run-loss_epoch", "run-loss_step", "step"]
