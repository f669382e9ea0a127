import contextlib
import csv
import os
import warnings

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
    as Lightning's from the same fit (fw keeps the columns in the order they came; docs/lightning.md)."""
    import inspect

    from lightning.modules import make_regressor, regression_loader

    import framework as fw

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


def _blocks_the_folder(base, folder, block_after: int, back_after: int | None = None):
    """A callback (on fw's or Lightning's ``Callback``) that, after global step ``block_after``,
    puts a file where ``folder()`` is (so that nothing can be written there, root included: chmod
    does not stop root), and puts the folder back after step ``back_after``."""

    class BlocksTheFolder(base):
        def on_train_batch_end(self, trainer, *args, **kwargs):
            path = folder()
            if trainer.global_step == block_after:
                os.rename(path, path + ".away")
                with open(path, "w") as f:
                    f.write("a file where the log folder was")
            if trainer.global_step == back_after:
                os.remove(path)
                os.rename(path + ".away", path)

    return BlocksTheFolder()


def _fit_blocked(tmp_path, back_after):
    import warnings

    from toy import LinearModel, ToyData

    import framework as fw
    from framework.callbacks import ModelCheckpoint
    from framework.rank_zero import FwWarning
    from loggers.fits import SETTINGS

    logger = CSVLogger(save_dir=tmp_path / "fw", name="exp", flush_logs_every_n_steps=1)
    recorder = CSVLogger(save_dir=tmp_path / "sent", name="exp", flush_logs_every_n_steps=1)
    checkpoint = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), save_top_k=-1)
    trainer = fw.Trainer(logger=[logger, recorder], default_root_dir=str(tmp_path), callbacks=[
        checkpoint, _blocks_the_folder(fw.Callback, lambda: logger.log_dir, 3, back_after)], **SETTINGS)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        trainer.fit(LinearModel(lr=0.05), datamodule=ToyData())  # 8 steps
    saved = sorted(name for name in os.listdir(tmp_path / "ckpt") if name.endswith(".ckpt"))
    assert saved == ["epoch=0-step=4.ckpt", "epoch=1-step=8.ckpt"]  # training never stopped
    said = [str(w.message) for w in record if issubclass(w.category, FwWarning)]
    return logger, _read(recorder.metrics_file_path)[1], said


def test_a_log_folder_that_goes_away_and_comes_back_gets_every_row(tmp_path):
    """fw: one warning, the fit goes on, the rows that waited are written when the folder is back.
    Lightning's CSVLogger in the same case ends the fit with the OSError."""
    logger, sent_rows, said = _fit_blocked(tmp_path, back_after=6)
    assert len(said) == 1 and said[0].startswith(f"CSVLogger: cannot write {logger.metrics_file_path} ("), said
    assert "); training goes on, and the rows wait (up to 10000) to be written when it can be" in said[0]
    assert _read(logger.metrics_file_path)[1] == sent_rows  # every row, in order

    pl = pytest.importorskip("pytorch_lightning")
    from pytorch_lightning.loggers import CSVLogger as LightningCSVLogger
    from toy import loader, regression_data

    from loggers.fits import SETTINGS, LogsLosses

    class Net(LogsLosses, pl.LightningModule):
        def __init__(self, lr: float = 0.05):
            super().__init__()
            self.save_hyperparameters()
            self.seeded_net()

    lightning_logger = LightningCSVLogger(save_dir=tmp_path / "pl", name="exp", flush_logs_every_n_steps=1)
    trainer = pl.Trainer(logger=lightning_logger, enable_checkpointing=False, callbacks=[
        _blocks_the_folder(pl.Callback, lambda: lightning_logger.log_dir, 3)], **SETTINGS)
    import signal

    handler = signal.getsignal(signal.SIGTERM)
    data = regression_data(32)
    try:
        with pytest.raises(OSError, match=r"\[Errno \d+\]"):  # the OS's refusal, whichever call met it
            trainer.fit(Net(), loader(data), loader(data))
    finally:
        signal.signal(signal.SIGTERM, handler)  # Lightning's failed fit leaves its handler there


def test_a_log_folder_that_never_comes_back_is_one_warning_and_one_count(tmp_path):
    logger, sent_rows, said = _fit_blocked(tmp_path, back_after=None)
    written = _read(os.path.join(logger.log_dir + ".away", "metrics.csv"))[1]
    assert len(said) == 2 and said[0].startswith(f"CSVLogger: cannot write {logger.metrics_file_path} "), said
    assert said[1] == f"CSVLogger: not written to {logger.metrics_file_path}: {len(sent_rows) - len(written)} rows"
    # the rows written before the folder went are the first ones sent (fewer columns: the later keys came later)
    assert 0 < len(written) < len(sent_rows)
    assert written == [{key: row[key] for key in written[0]} for row in sent_rows[:len(written)]]


def _fill(folder, leave: int) -> str:
    """Fill the disk of ``folder`` but ``leave`` bytes; the filler's path."""
    stats = os.statvfs(folder)
    filler = os.path.join(folder, "filler")
    with open(filler, "wb") as f, contextlib.suppress(OSError):
        f.write(b"x" * (stats.f_bavail * stats.f_frsize - leave))
    return filler


@pytest.mark.parametrize("freed", [True, False])
def test_a_disk_that_fills_in_the_middle_of_a_write_leaves_no_torn_row(mount, freed):
    """A disk with room for a few rows of the 50 being written: the write fails part-way. The part
    written is cut back, so when the disk has room again (or at the end) the file parses with every
    row exactly once, in order; when it never has, the warning counts exactly the rows missing.
    Before, the torn row stayed and the rows were written again after it (duplicated steps)."""
    disk = mount("size=512k")
    logger = CSVLogger(save_dir=disk, name="x", version=0, flush_logs_every_n_steps=50)
    rows = [{f"loss{i}": 0.123456789 + step for i in range(20)} for step in range(250)]
    for step in range(50):
        logger.log_metrics(rows[step], step)  # written while there is room
    filler = _fill(disk, leave=1500)  # room for about 5 rows of the next 50
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for step in range(50, 250):
            logger.log_metrics(rows[step], step)
        if freed:
            os.remove(filler)
        logger.finalize("success")
    said = [str(w.message) for w in record]
    assert said[0].startswith(f"CSVLogger: cannot write {logger.metrics_file_path} (OSError: "), said
    _, written = _read(logger.metrics_file_path)  # parses: no torn line
    assert [int(row["step"]) for row in written] == list(range(len(written)))  # each once, in order
    assert all(float(row["loss7"]) == rows[int(row["step"])]["loss7"] for row in written)
    if freed:
        assert len(written) == 250
        assert not [s for s in said if "not written" in s], said
    else:
        assert 50 <= len(written) < 250
        assert said[-1] == f"CSVLogger: not written to {logger.metrics_file_path}: {250 - len(written)} rows"
