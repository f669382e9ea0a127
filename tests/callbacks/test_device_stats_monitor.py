"""DeviceStatsMonitor through the real CSV logger: the CPU statistics (psutil) land in metrics.csv
under Lightning's names, at the rows where Lightning 2.6's DeviceStatsMonitor writes them (the
same ``(step, column)`` cells from both frameworks' CSV loggers: in training every
``log_every_n_steps`` batches that stepped, in validation and test every ``log_every_n_steps``
batches of the stage), and the set-ups it cannot serve are refused."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from toy import LinearModel, loader, regression_data

import framework as fw
from framework.callbacks import DeviceStatsMonitor
from framework.errors import ConfigError
from framework.loggers import CSVLogger

PREFIX = "DeviceStatsMonitor."
SETTINGS = dict(max_epochs=2, log_every_n_steps=2, accumulate_grad_batches=2, num_sanity_val_steps=2,
                enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                devices=1)


def _cells(path: Path) -> tuple[set[tuple[int, str]], list[float]]:
    """The (step, column) of every DeviceStatsMonitor value in a metrics.csv, and the values."""
    cells, values = set(), []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            for key, value in row.items():
                if key.startswith(PREFIX) and value != "":
                    cells.add((int(row["step"]), key))
                    values.append(float(value))
    return cells, values


def make_model(Base):
    class Model(Base):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            return F.mse_loss(self.net(batch[0]), batch[1])

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", F.mse_loss(self.net(batch[0]), batch[1]))

        def test_step(self, batch, batch_idx):
            self.log("test_loss", F.mse_loss(self.net(batch[0]), batch[1]))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    return Model()


def _run(tmp_path: Path, which: str, cpu_stats=None) -> Path:
    data = regression_data(48)  # 6 training batches (3 steps) per epoch; 3 validation, 2 test batches
    train, val, test = loader(data, 8), loader(data, 16), loader(regression_data(16), 8)
    if which == "lightning":
        import pytorch_lightning as pl
        from pytorch_lightning.callbacks import DeviceStatsMonitor as Theirs
        from pytorch_lightning.loggers import CSVLogger as TheirLogger

        logger = TheirLogger(tmp_path / which, name="logs")
        trainer = pl.Trainer(logger=logger, callbacks=[Theirs(cpu_stats=cpu_stats)], **SETTINGS)
        model = make_model(pl.LightningModule)
    else:
        logger = CSVLogger(tmp_path / which, name="logs")
        trainer = fw.Trainer(logger=logger, callbacks=[DeviceStatsMonitor(cpu_stats=cpu_stats)], **SETTINGS)
        model = make_model(fw.TrainModule)
    trainer.fit(model, train, val)
    trainer.test(model, test, verbose=False)
    return Path(logger.log_dir) / "metrics.csv"


@pytest.mark.skipif(importlib.util.find_spec("pytorch_lightning") is None, reason="pytorch_lightning is not installed")
def test_cpu_stats_land_in_the_csv_where_lightning_puts_them(tmp_path):
    ours, values = _cells(_run(tmp_path, "fw"))
    theirs, _ = _cells(_run(tmp_path, "lightning"))
    assert ours == theirs
    keys = {key for _, key in ours}
    for hook in ("on_train_batch_start", "on_train_batch_end", "on_validation_batch_start",
                 "on_validation_batch_end", "on_test_batch_start", "on_test_batch_end"):
        assert {f"{PREFIX}{hook}/{name}" for name in ("cpu_percent", "cpu_vm_percent", "cpu_swap_percent")} <= keys
    assert values and all(0 <= v <= 100 for v in values)
    # cpu_stats=False on the CPU: nothing to log
    assert _cells(_run(tmp_path / "off", "fw", cpu_stats=False))[0] == set()


def test_a_trainer_without_a_logger_is_refused():
    trainer = fw.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False, accelerator="cpu",
                         devices=1, max_epochs=1, callbacks=[DeviceStatsMonitor()])
    with pytest.raises(ConfigError, match=r"DeviceStatsMonitor needs a logger, and the Trainer has none"):
        trainer.fit(LinearModel(), loader(regression_data(16), 8))


def test_cpu_stats_without_psutil_are_refused_with_the_install_hint(monkeypatch, tmp_path):
    import importlib.util as util

    real = util.find_spec
    monkeypatch.setattr(util, "find_spec", lambda name, *a: None if name == "psutil" else real(name, *a))
    trainer = fw.Trainer(logger=CSVLogger(tmp_path), enable_checkpointing=False, enable_progress_bar=False,
                         accelerator="cpu", devices=1, max_epochs=1, callbacks=[DeviceStatsMonitor()])
    with pytest.raises(ModuleNotFoundError, match=r"needs the psutil package, which is not installed: pip install psutil"):
        trainer.fit(LinearModel(), loader(regression_data(16), 8))
