"""ModelCheckpoint, EarlyStopping and LearningRateMonitor take Lightning's arguments, in
Lightning's order and with its meaning: a callback written for Lightning runs on fw, positional
arguments included, and what fw cannot do is refused by name."""

from __future__ import annotations

import inspect
import os
import warnings

import pytest
import torch
from torch.utils.data import DataLoader

import framework as fw
from framework.callbacks import EarlyStopping, LearningRateMonitor, ModelCheckpoint
from framework.errors import ConfigError
from lightning.modules import QUIET, make_summing, sum_data

pl = pytest.importorskip("pytorch_lightning")

PAIRS = [(ModelCheckpoint, pl.callbacks.ModelCheckpoint), (EarlyStopping, pl.callbacks.EarlyStopping),
         (LearningRateMonitor, pl.callbacks.LearningRateMonitor)]


@pytest.mark.parametrize(("ours", "theirs"), PAIRS, ids=[p[0].__name__ for p in PAIRS])
def test_the_arguments_are_lightnings_in_lightnings_order(ours, theirs):
    def names(cls):
        return [name for name in inspect.signature(cls.__init__).parameters if name != "self"]

    assert names(ours) == names(theirs)


def _fit(which: str, callbacks: list, root, optimizer=None, logger=False, max_epochs=2, log_every_n_steps=1,
         **trainer_args):
    lib, base = (fw, fw.TrainModule) if which == "fw" else (pl, pl.LightningModule)

    class Model(make_summing(base, lr=0.05)):
        def training_step(self, batch, batch_idx):
            return self.mse(batch)

        def configure_optimizers(self):
            return optimizer(self) if optimizer is not None else super().configure_optimizers()

    settings = {**QUIET, "max_epochs": max_epochs, "enable_checkpointing": True, **trainer_args}
    trainer = lib.Trainer(default_root_dir=str(root), callbacks=callbacks, logger=logger,
                          log_every_n_steps=log_every_n_steps, **settings)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(Model(), DataLoader(sum_data(24), batch_size=8))
    return trainer


def _groups(module):
    params = list(module.parameters())
    return torch.optim.SGD([{"params": params[:1], "weight_decay": 0.1}, {"params": params[1:], "lr": 0.02}],
                           lr=0.05, momentum=0.9)


def _one_named_group(module):
    return torch.optim.SGD([{"params": list(module.parameters()), "name": "all", "weight_decay": 0.2}],
                           lr=0.05, momentum=0.9)


@pytest.mark.parametrize("optimizer", [_groups, _one_named_group], ids=["two-groups", "one-named-group"])
def test_learning_rates_momenta_and_weight_decays_are_logged_under_lightnings_names(tmp_path, optimizer):
    from pytorch_lightning.loggers import CSVLogger as LightningCSV

    from framework.loggers import CSVLogger

    logged = {}
    for which, monitor, logger in (("fw", LearningRateMonitor, CSVLogger), ("pl", pl.callbacks.LearningRateMonitor,
                                                                              LightningCSV)):
        trainer = _fit(which, [monitor(log_momentum=True, log_weight_decay=True)], tmp_path / which, optimizer,
                       logger=logger(str(tmp_path / which)))
        logged[which] = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("lr-")}
    assert logged["fw"] == logged["pl"] and any(k.endswith("-weight_decay") for k in logged["fw"])


def test_positional_arguments_mean_what_they_mean_in_lightning():
    stop = EarlyStopping("loss", 0.5, 7)  # monitor, min_delta, patience
    assert (stop.min_delta, stop.patience) == (0.5, 7)
    checkpoint = ModelCheckpoint(None, "{epoch}", "loss", True, True, 2)  # ..., verbose, save_last, save_top_k
    assert (checkpoint.verbose, checkpoint.save_last, checkpoint.save_top_k) == (True, True, 2)


@pytest.mark.parametrize("counter", [True, False])
def test_enable_version_counter_as_in_lightning(tmp_path, counter):
    """Two fits into one folder with one file name: ``-v1`` beside it, or the file replaced."""
    files = {}
    for which, cls in (("fw", ModelCheckpoint), ("pl", pl.callbacks.ModelCheckpoint)):
        folder = tmp_path / which / "checkpoints"
        for _ in range(2):
            _fit(which, [cls(dirpath=str(folder), filename="fixed", enable_version_counter=counter)], tmp_path / which)
        files[which] = sorted(f for f in os.listdir(folder) if f.endswith(".ckpt"))  # fw keeps an index beside
    assert files["fw"] == files["pl"] == (["fixed-v1.ckpt", "fixed.ckpt"] if counter else ["fixed.ckpt"])


def test_verbose_says_where_each_checkpoint_went(tmp_path, capsys):
    _fit("fw", [ModelCheckpoint(verbose=True)], tmp_path, max_epochs=1)
    assert "saved " in capsys.readouterr().err


@pytest.mark.parametrize("argument", [dict(train_time_interval=60), dict(save_on_exception=True)],
                         ids=lambda a: next(iter(a)))
def test_what_fw_does_not_have_is_refused_by_name(argument):
    with pytest.raises(ConfigError, match=next(iter(argument))):
        ModelCheckpoint(**argument)


def _lr_rows(which: str, root, scheduled: bool, every: int, accumulate: int) -> list[tuple[int, float]]:
    import csv

    from pytorch_lightning.loggers import CSVLogger as LightningCSV

    from framework.loggers import CSVLogger

    def optimizer(module):
        opt = torch.optim.SGD(module.parameters(), lr=0.1)
        if not scheduled:
            return opt
        return {"optimizer": opt, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(opt, 1, 0.5),
                                                   "interval": "step"}}

    monitor, logger = (LearningRateMonitor, CSVLogger) if which == "fw" else \
        (pl.callbacks.LearningRateMonitor, LightningCSV)
    trainer = _fit(which, [monitor()], root, optimizer, logger=logger(str(root)), log_every_n_steps=every,
                   accumulate_grad_batches=accumulate)
    trainer.logger.finalize("success")
    with open(os.path.join(trainer.logger.log_dir, "metrics.csv")) as f:
        return [(int(row["step"]), float(row["lr-SGD"])) for row in csv.DictReader(f) if row.get("lr-SGD")]


@pytest.mark.parametrize(("scheduled", "every", "accumulate"), [(True, 2, 1), (False, 1, 1), (False, 2, 1), (True, 1, 2)],
                         ids=["step-scheduler-every-2", "no-scheduler-every-step", "no-scheduler-every-2",
                              "step-scheduler-accumulating"])
def test_learning_rates_are_logged_at_lightnings_steps(tmp_path, scheduled, every, accumulate):
    """At the batches whose step is a logging one (Lightning's ``(step + 1) % n``: under gradient
    accumulation each batch of that step), and, for an optimizer without a scheduler, also at
    each epoch's start."""
    ours = _lr_rows("fw", tmp_path / "fw", scheduled, every, accumulate)
    theirs = _lr_rows("pl", tmp_path / "pl", scheduled, every, accumulate)
    assert ours == theirs and len(ours) > 2


@pytest.mark.parametrize(("flag", "callback"), [("enable_checkpointing", "ModelCheckpoint"),
                                            ("enable_progress_bar", "RichProgressBar")])
def test_a_callback_its_flag_turns_off_is_refused_as_lightning_refuses_it(flag, callback):
    """Turned off by its flag and given in the callbacks: Lightning refuses it; fw used to drop
    the callback without a word (a ModelCheckpoint that never saved)."""
    from lightning_fabric.utilities.exceptions import MisconfigurationException

    with pytest.raises(MisconfigurationException, match=flag):
        pl.Trainer(**{flag: False}, callbacks=[getattr(pl.callbacks, callback)()])
    with pytest.raises(ConfigError, match=f"{flag}=false.*{callback}"):
        fw.Trainer(**{flag: False}, callbacks=[getattr(fw.callbacks, callback)()])


@pytest.mark.timeout(60)
def test_current_score_is_the_latest_top_k_saves_value_as_lightnings(tmp_path):
    """``ModelCheckpoint.current_score``: the monitored value of its latest top-k save (None before
    one), and ``current_score`` in its state, as Lightning's."""
    seen = {}
    for which in ("fw", "pl"):
        lib = fw if which == "fw" else pl
        monitor = lib.callbacks.ModelCheckpoint(dirpath=str(tmp_path / which / "ck"), monitor="loss", save_top_k=2)
        assert monitor.current_score is None

        class Logging(lib.Callback):
            def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
                module.log("loss", outputs["loss"], on_step=False, on_epoch=True)

        _fit(which, [Logging(), monitor], tmp_path / which, max_epochs=3)
        seen[which] = [float(monitor.current_score), float(monitor.state_dict()["current_score"]),
                       *sorted(float(v) for v in monitor.best_k_models.values())]
    assert seen["fw"] == pytest.approx(seen["pl"], rel=1e-6)
    assert seen["fw"][0] == seen["fw"][1] in seen["fw"][2:]
