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


class _Recorder(TensorBoardLogger):
    """A TensorBoardLogger (on a disk with room) that also keeps every call it was given."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = []

    def log_metrics(self, metrics, step):
        self.calls.append((step, {key: float(value) for key, value in metrics.items()}))
        super().log_metrics(metrics, step)


def _write_until_full(f) -> None:
    while True:
        f.write(b"x" * 4096)
        f.flush()


def _fills_the_disk(base, disk, fill_at: int, free_at: int | None = None):
    """A callback (on fw's or Lightning's ``Callback``) that fills the tmpfs ``disk`` after global
    step ``fill_at`` and frees it after step ``free_at``."""
    filler = disk / "filler"

    class FillsTheDisk(base):
        def on_train_batch_end(self, trainer, *args, **kwargs):
            if trainer.global_step == fill_at:
                with pytest.raises(OSError, match="No space left on device"), open(filler, "wb") as f:
                    _write_until_full(f)
            if trainer.global_step == free_at:
                filler.unlink()

    return FillsTheDisk()


def _module(base):
    """The module of tests/loggers/fits.py, with 60 more values a step: each log call then needs
    a new page of the event file, which a full disk refuses."""
    from loggers.fits import LogsLosses

    class Net(LogsLosses, base):
        def __init__(self, lr: float = 0.05):
            super().__init__()
            self.save_hyperparameters()
            self.seeded_net()

        def training_step(self, batch, batch_idx):
            self.log_dict({f"more/{k}": float(k) for k in range(60)})
            return super().training_step(batch, batch_idx)

    return Net()


def _fit_on_a_disk_that_fills(tmp_path, disk, free_at):
    import warnings

    from toy import loader, regression_data

    import framework as fw
    from framework.callbacks import ModelCheckpoint
    from framework.rank_zero import FwWarning
    from loggers.fits import SETTINGS

    logger, recorder = TensorBoardLogger(save_dir=disk, name="exp"), _Recorder(save_dir=tmp_path / "sent", name="exp")
    checkpoint = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), save_top_k=-1)  # on a disk with room
    trainer = fw.Trainer(logger=[logger, recorder], default_root_dir=str(tmp_path),
                         callbacks=[checkpoint, _fills_the_disk(fw.Callback, disk, 3, free_at)], **SETTINGS)
    data = regression_data(32)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        trainer.fit(_module(fw.TrainModule), loader(data), loader(data))  # 8 steps
    saved = sorted(name for name in os.listdir(tmp_path / "ckpt") if name.endswith(".ckpt"))
    assert saved == ["epoch=0-step=4.ckpt", "epoch=1-step=8.ckpt"]  # training never stopped
    said = [str(w.message) for w in record if issubclass(w.category, FwWarning)]
    assert said[0] == (f"TensorBoardLogger: cannot write {logger.log_dir} (OSError: No space left on device); "
                       "training goes on, and the log_metrics calls wait (up to 10000) to be written when it can be")
    written = _scalars(logger.log_dir)
    unwritten = [(step, values) for step, values in recorder.calls
                 if not all((step, value) in written.get(key, []) for key, value in values.items())]
    return logger, recorder, written, unwritten, said


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # Lightning's writer thread
def test_a_full_disk_mid_fit_is_one_warning_and_every_value_is_written_when_it_has_room(tmp_path, mount, capfd):
    """fw: the fit goes on, one warning (no thread traceback), and the values that waited go to a
    new event file once the disk has room. Lightning's TensorBoardLogger ends the fit with the OSError."""
    logger, recorder, written, unwritten, said = _fit_on_a_disk_that_fills(tmp_path, mount("size=64k"), free_at=6)
    assert len(said) == 1 and unwritten == []
    from collections import Counter

    sent = _scalars(recorder.log_dir)
    assert sorted(written) == sorted(sent)
    assert all(not Counter(sent[key]) - Counter(written[key]) for key in sent)  # every value, as often as sent
    # The values of the call being written when the disk filled may be there twice (before, and in the new file).
    twice = {(key, step, value) for key in sent for step, value in Counter(written[key]) - Counter(sent[key])}
    assert twice <= {(key, step, value) for step, values in recorder.calls for key, value in values.items()}
    assert len({step for _, step, _ in twice}) <= 1
    assert len(os.listdir(logger.log_dir)) == 3  # the first event file, the one after the disk had room, hparams.yaml
    assert "Traceback" not in capfd.readouterr().err

    pl = pytest.importorskip("pytorch_lightning")
    import signal
    import threading

    from pytorch_lightning.loggers import TensorBoardLogger as LightningTensorBoardLogger
    from toy import loader, regression_data

    from loggers.fits import SETTINGS

    disk = mount("size=64k")
    trainer = pl.Trainer(logger=LightningTensorBoardLogger(save_dir=disk, name="exp"), enable_checkpointing=False,
                         callbacks=[_fills_the_disk(pl.Callback, disk, 3)], **SETTINGS)
    handler = signal.getsignal(signal.SIGTERM)
    data = regression_data(32)
    try:
        with pytest.raises(OSError, match="No space left on device"):
            trainer.fit(_module(pl.LightningModule), loader(data), loader(data))
    finally:
        signal.signal(signal.SIGTERM, handler)  # Lightning's failed fit leaves its handler there
        # Its writer's thread, dead of the OSError, may still be on its way to threading.excepthook:
        # wait for it here, or pytest gives its traceback to whichever test runs next.
        for thread in threading.enumerate():
            if getattr(thread, "exception", None) is not None and hasattr(thread, "_record_writer"):
                thread.join(timeout=30)


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")  # the writer's thread is quiet
def test_a_disk_that_stays_full_is_one_warning_and_one_count(tmp_path, mount):
    logger, recorder, _, unwritten, said = _fit_on_a_disk_that_fills(tmp_path, mount("size=64k"), free_at=None)
    assert said[1:] == [f"TensorBoardLogger: not written to {logger.log_dir}: {len(unwritten)} log_metrics calls"]
    assert 0 < len(unwritten) < len(recorder.calls)
    assert unwritten == recorder.calls[-len(unwritten):]  # what was written is the calls before the disk filled
    assert len([name for name in os.listdir(logger.log_dir) if name.startswith("events.")]) == 1  # no empty files


def test_the_hook_that_quiets_failed_writer_threads_is_there_only_while_a_folder_is_live(tmp_path, monkeypatch):
    """The ``threading.excepthook`` that keeps a writer thread's ``OSError`` from being printed is
    put there by the first writer and taken away when the last logger with a folder is finalized;
    before, it stayed for good."""
    import threading

    import framework.loggers.tensorboard as tensorboard

    monkeypatch.setattr(tensorboard, "_QUIET", tensorboard._QuietWriterThreads())  # no folder of another test
    monkeypatch.setattr(threading, "excepthook", threading.excepthook)  # put back whatever happens
    before = threading.excepthook
    first = TensorBoardLogger(save_dir=tmp_path, name="a", default_hp_metric=False)
    second = TensorBoardLogger(save_dir=tmp_path, name="b", default_hp_metric=False)
    first.log_metrics({"m": 1.0}, 0)
    second.log_metrics({"m": 1.0}, 0)
    assert threading.excepthook is not before
    first.finalize("success")
    assert threading.excepthook is not before  # the second one's folder is still live
    second.finalize("success")
    assert threading.excepthook is before
