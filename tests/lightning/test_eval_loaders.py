"""Several validation or test loaders: each loader's metrics under ``name/dataloader_idx_N``
(the suffix after the ``_step``/``_epoch`` fork), aggregated over that loader's batches alone;
``validate``/``test`` return one dict per loader (with the epoch hooks' values in each); the
loggers get each loader's step rows and one row at the end; ``add_dataloader_idx=False`` with
one name from two loaders, and a name that carries the suffix itself, are refused. Each case
runs the same module on fw and on Lightning and compares what they give."""

from __future__ import annotations

from typing import ClassVar

import pytest
from torch.utils.data import DataLoader

import framework as fw
from framework.errors import ConfigError
from lightning.modules import QUIET, make_summing, sum_data

pl = pytest.importorskip("pytorch_lightning")


def _module(base: type, add_dataloader_idx: bool = True, name_of=lambda i: "val_loss"):
    class Logs(make_summing(base, lr=0.05)):
        def training_step(self, batch, batch_idx):
            loss = self.mse(batch)
            self.log("loss", loss)
            return loss

        def validation_step(self, batch, batch_idx, dataloader_idx=0):
            loss = self.mse(batch)
            self.log(name_of(dataloader_idx), loss, prog_bar=True, add_dataloader_idx=add_dataloader_idx)
            self.log("both", loss * 2, on_step=True, prog_bar=True)
            self.log("summed", loss, reduce_fx="sum")
            self.log("unweighted", loss, batch_size=1)

        test_step = validation_step

        def on_validation_batch_end(self, outputs, batch, batch_idx, dataloader_idx=0):
            self.log("in_batch_end", float(batch_idx))

        def on_validation_epoch_end(self):
            self.log("at_epoch_end", 5.0)

    return Logs()


def _loaders() -> list[DataLoader]:
    return [DataLoader(sum_data(5), batch_size=2), DataLoader(sum_data(12), batch_size=4)]  # 3 and 3 batches


def _floats(metrics: dict) -> dict:
    return {k: float(v) for k, v in metrics.items()}


def _run(trainer_cls, base, logger) -> dict:
    trainer = trainer_cls(logger=logger, log_every_n_steps=1, **QUIET)
    model = _module(base)
    trainer.fit(model, DataLoader(sum_data(8), batch_size=4), _loaders())
    out = {"fit_rows": list(logger.rows), "fit_callback": _floats(trainer.callback_metrics)}
    logger.rows.clear()
    out["validate"] = trainer.validate(model, _loaders(), verbose=False)
    out.update(rows=list(logger.rows), callback=_floats(trainer.callback_metrics),
               logged=_floats(trainer.logged_metrics), bar=_floats(trainer.progress_bar_metrics))
    out["test"] = trainer.test(model, _loaders(), verbose=False)
    return out


def _rounded(value):
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_rounded(v) for v in value)
    return round(value, 5) if isinstance(value, float) else value


@pytest.mark.timeout(60)
def test_each_loader_logs_and_returns_its_own_values_as_in_lightning():
    from toy import RecordingLogger

    from lightning.test_logging_steps import LightningRecorder

    ours = _run(fw.Trainer, fw.TrainModule, RecordingLogger())
    theirs = _run(pl.Trainer, pl.LightningModule, LightningRecorder())
    for part in theirs:
        assert _rounded(ours[part]) == _rounded(theirs[part]), part
    assert sorted(ours["validate"][1]) == ["at_epoch_end", "both_epoch/dataloader_idx_1", "in_batch_end/dataloader_idx_1",
                                           "summed/dataloader_idx_1", "unweighted/dataloader_idx_1",
                                           "val_loss/dataloader_idx_1"]


def _validate(trainer_cls, base, **module_args):
    trainer = trainer_cls(logger=False, **QUIET)
    return trainer.validate(_module(base, **module_args), _loaders(), verbose=False)


@pytest.mark.timeout(30)
def test_add_dataloader_idx_false_keeps_the_name_and_refuses_one_name_from_two_loaders():
    own_names = dict(add_dataloader_idx=False, name_of=lambda i: f"val_loss_{'ab'[i]}")
    ours, theirs = _validate(fw.Trainer, fw.TrainModule, **own_names), _validate(pl.Trainer, pl.LightningModule,
                                                                                 **own_names)
    assert _rounded(ours) == _rounded(theirs)
    assert "val_loss_a" in ours[0] and "val_loss_a" not in ours[1] and "val_loss_b" in ours[1]

    with pytest.raises(ConfigError, match=r"add_dataloader_idx=False\) in loader 1 after loader 0 logged 'val_loss'"):
        _validate(fw.Trainer, fw.TrainModule, add_dataloader_idx=False)
    with pytest.raises(Exception, match="twice in `validation_step` with different arguments"):
        _validate(pl.Trainer, pl.LightningModule, add_dataloader_idx=False)


@pytest.mark.timeout(30)
def test_a_name_with_the_suffix_in_it_is_refused_unless_add_dataloader_idx_is_false():
    suffixed = dict(name_of=lambda i: f"val_loss/dataloader_idx_{i}")
    with pytest.raises(ConfigError, match="adds '/dataloader_idx_N' to the name itself"):
        _validate(fw.Trainer, fw.TrainModule, **suffixed)
    with pytest.raises(Exception, match="should not contain information about `dataloader_idx`"):
        _validate(pl.Trainer, pl.LightningModule, **suffixed)


@pytest.mark.timeout(30)
def test_one_loader_has_no_suffix():
    trainer = fw.Trainer(logger=False, **QUIET)
    [values] = trainer.validate(_module(fw.TrainModule), [_loaders()[0]], verbose=False)
    assert "val_loss" in values and not any("dataloader_idx" in k for k in values)


def _skipped(trainer_cls, base) -> tuple[list, list[str]]:
    class Recorded(type(_module(base))):
        calls: ClassVar[list[str]] = []

        def on_validation_start(self):
            self.calls.append("on_validation_start")

        def on_validation_model_eval(self):
            self.calls.append("on_validation_model_eval")
            super().on_validation_model_eval()

    model = Recorded()
    trainer = trainer_cls(logger=False, limit_val_batches=0, **QUIET)
    return trainer.validate(model, _loaders(), verbose=False), model.calls


@pytest.mark.timeout(30)
def test_no_batch_to_validate_returns_nothing_and_calls_no_validation_hook_as_in_lightning():
    ours, theirs = _skipped(fw.Trainer, fw.TrainModule), _skipped(pl.Trainer, pl.LightningModule)
    assert ours == theirs == ([], [])
