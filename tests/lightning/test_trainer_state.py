"""The Trainer's state around each call equals Lightning's: ``state.fn``, ``state.stage``,
``state.status`` and the ``training``/``validating``/``testing``/``predicting``/``sanity_checking``
flags, in every callback hook and the module's ``setup``/``teardown``, and between the calls
(``fn`` stays the last call's); and ``trainer.log_dir`` before a fit and without a logger."""

from __future__ import annotations

import inspect
import os

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import framework as fw

pl = pytest.importorskip("pytorch_lightning")

#: fw asks for a call's loaders once at set-up (docs/lightning.md, "Where fw deliberately differs"): not compared
LOADER_HOOKS = {"train_dataloader", "val_dataloader"}


def _data() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)), batch_size=4)


def _state_in_every_hook(lib, base: type, callback_base: type, **trainer_args) -> list[tuple]:
    """(where, fn, stage, status, training, validating, testing, predicting, sanity_checking) at
    each callback hook, module set-up and teardown, and after fit, validate, test and predict."""
    rows: list[tuple] = []

    def note(where: str, trainer) -> None:
        state = trainer.state
        values = [str(getattr(v, "value", v)) if v is not None else None for v in (state.fn, state.stage, state.status)]
        rows.append((where, *values, trainer.training, trainer.validating, trainer.testing, trainer.predicting,
                     trainer.sanity_checking))

    hooks = [name for name, v in vars(pl.Callback).items()
             if name.startswith("on_") and inspect.isfunction(v) and name != "on_exception"]
    recorder = type("Recorder", (callback_base,), {
        name: (lambda hook: lambda self, trainer, *a, **k: note(hook, trainer))(name) for name in hooks})

    class Model(base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            return torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])

        def validation_step(self, batch, batch_idx):
            pass

        def test_step(self, batch, batch_idx):
            pass

        def predict_step(self, batch, batch_idx):
            return self.layer(batch[0])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def setup(self, stage):
            note(f"setup({getattr(stage, 'value', stage)})", self.trainer)

        def teardown(self, stage):
            note(f"teardown({getattr(stage, 'value', stage)})", self.trainer)

    trainer = lib.Trainer(accelerator="cpu", devices=1, max_epochs=1, enable_checkpointing=False,
                          enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=1,
                          callbacks=[recorder()], **trainer_args)
    note("before any call", trainer)
    model = Model()
    trainer.fit(model, _data(), _data())
    note("after fit", trainer)
    trainer.validate(model, _data(), verbose=False)
    note("after validate", trainer)
    trainer.test(model, _data(), verbose=False)
    note("after test", trainer)
    trainer.predict(model, _data())
    note("after predict", trainer)
    return rows


@pytest.mark.timeout(60)
def test_the_state_and_the_stage_flags_in_every_hook_and_between_calls_are_lightnings(tmp_path):
    ours = _state_in_every_hook(fw, fw.TrainModule, fw.Callback, logger=False, default_root_dir=str(tmp_path))
    theirs = _state_in_every_hook(pl, pl.LightningModule, pl.Callback, logger=False, default_root_dir=str(tmp_path))
    assert len({row[0] for row in ours}) > 20  # every callback hook of the four calls was seen
    assert ours == theirs
    fit_end = next(row for row in ours if row[0] == "on_fit_end")
    assert fit_end[1:] == ("fit", "train", "running", True, False, False, False, False)


@pytest.mark.timeout(60)
def test_log_dir_before_a_fit_and_without_a_logger_is_lightnings(tmp_path):
    root = str(tmp_path)
    for lib, name in ((fw, "fw_logs"), (pl, "lightning_logs")):  # fw's own folder name (docs/lightning.md)
        trainer = lib.Trainer(accelerator="cpu", default_root_dir=root, logger=lib.loggers.CSVLogger(root))
        assert trainer.log_dir == os.path.join(root, name, "version_0")
        assert lib.Trainer(accelerator="cpu", default_root_dir=root, logger=False).log_dir == root
