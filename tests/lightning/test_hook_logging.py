"""``self.log`` in the hooks, as Lightning does it (its ``_FxValidator`` table): a value logged
once an epoch or a stage (``on_train_start``, ``on_train_epoch_start``/``_end`` of the module and
of a callback, ``on_validation_start``, ``on_validation_epoch_start``/``_end``) is an epoch value
in the epoch's row; a value logged in ``on_train_batch_end`` is in the row of its own step; an
int column (``epoch``) stays an int. The same module gives the same ``metrics.csv`` rows,
``logged_metrics`` and ``callback_metrics`` through both Trainers' CSVLoggers. Where Lightning
refuses ``self.log`` (``on_fit_start``, ``on_step=True`` in ``on_train_epoch_end``), fw does too.
(fw used to log these hooks' values as step values, and never wrote those of
``on_train_epoch_end`` or ``on_train_start`` to a logger.)"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from torch import nn
from torch.utils.data import DataLoader

import framework as fw
from framework.errors import ConfigError
from framework.loggers import CSVLogger
from lightning.modules import QUIET, make_summing, sum_data

pl = pytest.importorskip("pytorch_lightning")


def _module(base: type) -> nn.Module:
    class Logs(make_summing(base, lr=0.05)):
        def training_step(self, batch, batch_idx):
            loss = self.mse(batch)
            self.log("loss", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", self.mse(batch))

        def on_train_start(self):
            self.log("train_start", 11.0)

        def on_train_epoch_start(self):
            self.log("epoch_start", self.current_epoch + 0.25)

        def on_train_batch_end(self, outputs, batch, batch_idx):
            self.log("batch_idx", float(batch_idx))

        def on_train_epoch_end(self):
            self.log("epoch_end", self.current_epoch + 0.5, prog_bar=True)

        def on_validation_start(self):
            self.log("val_start", 12.0)

        def on_validation_epoch_start(self):
            self.log("val_epoch_start", 13.0)

        def on_validation_epoch_end(self):
            self.log("val_epoch_end", 14.0)

    return Logs()


def _callback(base: type):
    class LogsAtEpochEnd(base):
        def on_train_epoch_end(self, trainer, module):
            module.log("callback_epoch_end", trainer.current_epoch + 9.0)

    return LogsAtEpochEnd()


def _run(trainer_cls, base, callback_base, logger_cls, out: Path) -> tuple[list[dict], dict, dict]:
    trainer = trainer_cls(logger=logger_cls(str(out), name="run", version=0), log_every_n_steps=3,
                          callbacks=[_callback(callback_base)], **QUIET)
    loader = DataLoader(sum_data(16), batch_size=4)
    trainer.fit(_module(base), loader, loader)
    with open(out / "run" / "version_0" / "metrics.csv", newline="") as f:
        rows = [{k: v for k, v in row.items() if v != ""} for row in csv.DictReader(f)]
    as_floats = lambda values: {k: float(v) for k, v in values.items()}  # noqa: E731
    return rows, as_floats(trainer.logged_metrics), as_floats(trainer.callback_metrics)


@pytest.mark.timeout(60)
def test_values_logged_in_hooks_land_in_lightnings_rows(tmp_path):
    from pytorch_lightning.loggers import CSVLogger as LightningCSV

    ours = _run(fw.Trainer, fw.TrainModule, fw.Callback, CSVLogger, tmp_path / "fw")
    theirs = _run(pl.Trainer, pl.LightningModule, pl.Callback, LightningCSV, tmp_path / "pl")
    assert ours[0] == theirs[0]  # every row: the same steps, columns and values (as written)
    assert ours[1] == theirs[1] and ours[2] == theirs[2]
    epoch_rows = [row for row in ours[0] if "epoch_end" in row]
    assert [row["epoch_end"] for row in epoch_rows] == ["0.5", "1.5"] and epoch_rows[0]["epoch"] == "0"
    assert "train_start" in epoch_rows[0] and "train_start" not in epoch_rows[1]  # once, in the first epoch


class _LogsInFitStart(fw.TrainModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(3, 1)

    def on_fit_start(self):
        self.log("too_early", 1.0)

    def training_step(self, batch, batch_idx):
        return self.net(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        import torch

        return torch.optim.SGD(self.parameters(), lr=0.1)


class _LogsOnStepAtEpochEnd(_LogsInFitStart):
    def on_fit_start(self):
        pass

    def on_train_epoch_end(self):
        self.log("per_step", 1.0, on_step=True)


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("module", "message"), [
    (_LogsInFitStart, "self.log('too_early') inside on_fit_start: a value logged there belongs to no step or epoch"),
    (_LogsOnStepAtEpochEnd, "self.log('per_step', on_step=True) inside on_train_epoch_end: there it can only be "
                            "on_step=False"),
])
def test_a_hook_where_lightning_refuses_self_log_is_refused(module, message):
    trainer = fw.Trainer(logger=False, **QUIET)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        trainer.fit(module(), DataLoader(sum_data(8), batch_size=4))
