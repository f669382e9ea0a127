"""Every public attribute that fw's Trainer shares with Lightning's reads the same after each of
fit, validate, test and predict, on Lightning's own BoringModel (its demo source with only the
imports changed): what Lightning keeps from one call to the next (the fit's optimizers and their
learning rate, its scheduler configs, the checkpoint callbacks' paths and scores, the batch counts
of the last fit, validate, test and predict) fw keeps too, and what Lightning starts afresh
(the metrics, the loaders) fw does too. Before, fw emptied ``trainer.optimizers`` in every call
after the fit, so Lightning's scenario (fit, validate, test, predict, then read the optimizer's
learning rate) ended in an IndexError."""

from __future__ import annotations

import inspect
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

import framework as fw
from lightning.boring_run import demo_classes

pl = pytest.importorskip("pytorch_lightning")

CALLS = ("init", "fit", "validate", "test", "predict")

#: the attributes not compared, and why
NOT_COMPARED = {
    "environment": "fw's cluster environment (Lightning's is the strategy's); ranks are compared",
}
#: where fw still reads otherwise, (attribute, after which call): why (docs/lightning.md, "Where fw still differs")
DIFFERENT = {
    **{("min_steps", call): "fw resolves a min_steps not given to 0 (no minimum); Lightning's is None"
       for call in CALLS},
    ("min_epochs", "init"): "fw resolves a min_epochs not given to 0 (no minimum); Lightning's is None before a fit",
    ("estimated_stepping_batches", "init"): "before any call fw says inf (unknown); Lightning returns max_steps, -1",
}


def _plain(value: Any, root: str) -> Any:
    """``value`` as plain data to compare: numbers, strings (the run's folder as ROOT), lists, dicts."""
    if isinstance(value, torch.Tensor):
        return float(value) if value.numel() == 1 else value.tolist()
    if isinstance(value, str):
        return value.replace(root, "ROOT")
    if isinstance(value, dict):
        return {_plain(k, root): _plain(v, root) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, root) for v in value]
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    if hasattr(value, "value") and isinstance(value.value, str):  # Lightning's string enums
        return value.value
    return value


def _checkpoints(cb: Any, root: str) -> Any:
    return None if cb is None else _plain({
        "best": cb.best_model_path, "last": cb.last_model_path, "score": cb.best_model_score,
        "kth": cb.kth_best_model_path, "kth_value": cb.kth_value, "best_k": cb.best_k_models,
        "current": cb.current_score}, root)


def _early_stopping(cb: Any, root: str) -> Any:
    return None if cb is None else _plain({"wait": cb.wait_count, "best": cb.best_score, "stopped": cb.stopped_epoch},
                                          root)


def _loaders(value: Any, root: str) -> Any:
    return None if value is None else (type(value).__name__, len(value))


def _type(value: Any, root: str) -> str:
    return type(value).__name__


#: how an attribute whose value is an object is read (the others: ``_plain``)
READ = {
    "optimizers": lambda v, root: [(type(o).__name__, [g["lr"] for g in o.param_groups]) for o in v],
    "lr_scheduler_configs": lambda v, root: [
        (type(c.scheduler).__name__, c.interval, c.frequency, c.monitor, c.scheduler.last_epoch,
         c.scheduler.get_last_lr()) for c in v],
    "checkpoint_callback": _checkpoints,
    "checkpoint_callbacks": lambda v, root: [_checkpoints(cb, root) for cb in v],
    "early_stopping_callback": _early_stopping,
    "early_stopping_callbacks": lambda v, root: [_early_stopping(cb, root) for cb in v],
    "callbacks": lambda v, root: [type(cb).__name__ for cb in v],
    "logger": lambda v, root: (type(v).__name__, _plain(v.log_dir, root), v.version),
    "loggers": lambda v, root: [(type(lg).__name__, _plain(lg.log_dir, root), lg.version) for lg in v],
    "state": lambda v, root: _plain([v.fn, v.stage, v.status], root),
    "fit_loop": lambda v, root: ([getattr(v.epoch_progress.current, n) for n in ("ready", "started", "processed",
                                                                                  "completed")],
                                 v.epoch_loop.batch_idx, v.epoch_loop.global_step, v.max_epochs, v.max_steps),
    "progress_bar_callback": _type, "accelerator": _type, "strategy": _type, "precision_plugin": _type,
    "profiler": _type, "scaler": _type,
    "train_dataloader": _loaders, "val_dataloaders": _loaders, "test_dataloaders": _loaders,
    "predict_dataloaders": _loaders,
}
#: read last: Lightning's asks for the training loader when it has none
LAST = "estimated_stepping_batches"


def _shared_attributes(ours: Any, theirs: Any) -> list[str]:
    """The public names both Trainers have that are not methods (properties and attributes)."""
    def names(trainer: Any) -> set[str]:
        return {n for n in dir(trainer) if not n.startswith("_") and not inspect.isfunction(getattr(type(trainer), n,
                                                                                                    None))}
    shared = names(ours) & names(theirs)
    return [*sorted(shared - set(NOT_COMPARED) - {LAST}), LAST]


def _read(trainer: Any, names: list[str], model: Any, root: str) -> dict[str, Any]:
    with torch.random.fork_rng(devices=[]):  # Lightning's estimated_stepping_batches builds the demo's random data
        return _read_all(trainer, names, model, root)


def _read_all(trainer: Any, names: list[str], model: Any, root: str) -> dict[str, Any]:
    out = {}
    for name in names:
        value = getattr(trainer, name)
        if name in ("model", "lightning_module"):
            out[name] = None if value is None else ("the model" if value is model else type(value).__name__)
        elif name == "datamodule":
            out[name] = value
        else:
            out[name] = READ.get(name, _plain)(value, root)
    return out


def _calls(lib: Any, which: str, root: Path, names: list[str]) -> dict[str, Any]:
    """fit, validate (on other data), test from the best checkpoint, predict; the Trainer's
    attributes before and after each."""
    demo = demo_classes(which)
    lib.seed_everything(3)

    class Logged(demo.BoringModel):
        def training_step(self, batch, batch_idx):
            out = super().training_step(batch, batch_idx)
            self.log("train_loss", out["loss"], prog_bar=True)
            return out

        def validation_step(self, batch, batch_idx):
            out = super().validation_step(batch, batch_idx)
            self.log("val_loss", out["x"], prog_bar=True)
            return out

        def test_step(self, batch, batch_idx):
            out = super().test_step(batch, batch_idx)
            self.log("test_loss", out["y"])
            return out

    model, other = Logged(), DataLoader(demo.RandomDataset(32, 24), batch_size=4)
    trainer = lib.Trainer(
        accelerator="cpu", devices=1, max_epochs=3, limit_val_batches=8, default_root_dir=str(root),
        enable_progress_bar=False, enable_model_summary=False, use_distributed_sampler=False,
        logger=lib.loggers.CSVLogger(str(root), name="logs"),
        callbacks=[lib.callbacks.ModelCheckpoint(dirpath=str(root / "ck"), monitor="val_loss", save_top_k=2,
                                                 save_last=True),
                   lib.callbacks.EarlyStopping(monitor="val_loss", patience=5)])
    seen = {"init": _read(trainer, names, model, str(root))}
    trainer.fit(model)
    seen["fit"] = _read(trainer, names, model, str(root))
    trainer.validate(model, dataloaders=other, verbose=False)
    seen["validate"] = _read(trainer, names, model, str(root))
    trainer.test(ckpt_path="best", verbose=False)
    seen["test"] = _read(trainer, names, model, str(root))
    trainer.predict(model)
    seen["predict"] = _read(trainer, names, model, str(root))
    try:  # Lightning's scenario: fw emptied trainer.optimizers
        seen["lr after predict"] = trainer.optimizers[0].param_groups[0]["lr"]
    except IndexError as exc:
        seen["lr after predict"] = repr(exc)
    return seen


@pytest.mark.timeout(120)
def test_every_shared_trainer_attribute_after_each_call_is_lightnings(tmp_path):
    names = _shared_attributes(fw.Trainer(accelerator="cpu", logger=False), pl.Trainer(accelerator="cpu", logger=False))
    ours = _calls(fw, "fw", tmp_path / "fw", names)
    theirs = _calls(pl, "lightning", tmp_path / "lightning", names)

    assert len(names) > 75 and {"optimizers", "num_test_batches", "logged_metrics", "model"} <= set(names)
    for (name, call), why in DIFFERENT.items():  # each difference listed is one still there
        assert ours[call][name] != theirs[call][name], f"{name} after {call} is Lightning's now ({why}): unlist it"
    differ = [f"{name} after {call}: fw {ours[call][name]!r}, Lightning {theirs[call][name]!r}"
              for call in CALLS for name in names
              if (name, call) not in DIFFERENT and ours[call][name] != theirs[call][name]]
    assert differ == [], "\n".join(differ)
    assert ours["lr after predict"] == theirs["lr after predict"] == pytest.approx(0.1 * 0.1 ** 3)

    # the scenario reads what it means to: a trained fit, then each call's own metrics and batch counts
    after = ours["predict"]
    assert ours["fit"]["global_step"] == 192 and ours["fit"]["checkpoint_callback"]["best"].startswith("ROOT/ck/")
    assert ours["validate"]["num_val_batches"] == [6] and ours["test"]["num_val_batches"] == [8]
    assert ours["test"]["ckpt_path"] == ours["fit"]["checkpoint_callback"]["best"]
    assert after["optimizers"] == [("SGD", [pytest.approx(1e-4)])] and after["num_test_batches"] == [64]
    assert after["logged_metrics"] == {} and after["model"] == after["lightning_module"] == "the model"


def _fit_numbers(which: str) -> list:
    """What ``num_training_batches`` and ``val_check_batch`` read after a fit of 3 batches, after a
    validate of another module, and during a second fit (5 batches) before its training starts."""
    base = pl.LightningModule if which == "lightning" else fw.TrainModule
    read = []

    class Model(base):
        def __init__(self, n: int):
            super().__init__()
            self.layer, self.n = torch.nn.Linear(4, 1), n

        def training_step(self, batch, batch_idx):
            return (self.layer(batch[0]) ** 2).mean()

        def validation_step(self, batch, batch_idx):
            read.append(("sanity" if self.trainer.sanity_checking else "val", self.trainer.num_training_batches,
                         self.trainer.val_check_batch))

        def on_fit_start(self):
            read.append(("fit_start", self.trainer.num_training_batches, self.trainer.val_check_batch))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self):
            return DataLoader(torch.utils.data.TensorDataset(torch.randn(4 * self.n, 4)), batch_size=4)

        def val_dataloader(self):
            return DataLoader(torch.utils.data.TensorDataset(torch.randn(4, 4)), batch_size=4)

    Trainer = pl.Trainer if which == "lightning" else fw.Trainer
    trainer = Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False, num_sanity_val_steps=1)
    trainer.fit(Model(3))
    read.append(("after fit", trainer.num_training_batches, trainer.val_check_batch))
    trainer.validate(Model(5), verbose=False)
    read.append(("after validate", trainer.num_training_batches, trainer.val_check_batch))
    trainer.fit(Model(5))
    read.append(("after fit", trainer.num_training_batches, trainer.val_check_batch))
    return read


@pytest.mark.timeout(60)
def test_the_last_fits_batch_counts_hold_until_the_next_fits_training_starts():
    """One record of the last fit's numbers (``trainer.last_fit``) answers both properties, after
    the fit, through the calls after it and in the next fit until its training starts, as
    Lightning's fit loop keeps its ``max_batches``."""
    ours, theirs = _fit_numbers("fw"), _fit_numbers("lightning")
    assert ours == theirs
    assert theirs == [("fit_start", math.inf, None), ("sanity", math.inf, None), ("val", 3, 3), ("after fit", 3, 3),
                      ("val", 3, 3), ("after validate", 3, 3),  # the validate's own step reads the fit's
                      ("fit_start", 3, 3), ("sanity", 3, 3),  # the second fit (max_epochs reached: no epoch runs)
                      ("after fit", 5, 5)]
