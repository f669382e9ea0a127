"""``LambdaCallback`` (a callback made of functions) calls what Lightning's calls, in the same
order with the same arguments' kinds; an unknown hook name is refused. A hook set on any
callback instance (as LambdaCallback sets them) is called, as Lightning calls it."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import framework as fw
from framework.callbacks import LambdaCallback
from framework.errors import ConfigError

pl = pytest.importorskip("pytorch_lightning")

HOOKS = ["setup", "teardown", "on_fit_start", "on_fit_end", "on_sanity_check_start", "on_sanity_check_end",
         "on_train_batch_start", "on_train_batch_end", "on_train_epoch_start", "on_train_epoch_end",
         "on_validation_epoch_start", "on_validation_epoch_end", "on_validation_batch_end", "on_train_start",
         "on_train_end", "on_validation_start", "on_validation_end", "on_save_checkpoint", "on_before_backward",
         "on_after_backward", "on_before_optimizer_step", "on_before_zero_grad", "on_test_start", "on_test_end",
         "on_predict_batch_end"]


def _data() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)), batch_size=4)


def _calls(lib, base: type, tmp_path) -> list[tuple]:
    calls: list[tuple] = []

    def recorder(name: str):
        return lambda trainer, module, *rest, **named: calls.append((name, trainer.global_step, len(rest), sorted(named)))

    class Model(base):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            return torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1]))

        def test_step(self, batch, batch_idx):
            pass

        def predict_step(self, batch, batch_idx):
            return self.layer(batch[0])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    callback = lib.callbacks.LambdaCallback(**{name: recorder(name) for name in HOOKS})
    trainer = lib.Trainer(accelerator="cpu", devices=1, max_epochs=2, logger=False, enable_progress_bar=False,
                          enable_model_summary=False, num_sanity_val_steps=1, default_root_dir=str(tmp_path),
                          callbacks=[callback, lib.callbacks.ModelCheckpoint(dirpath=str(tmp_path / "ck"))])
    model = Model()
    trainer.fit(model, _data(), _data())
    trainer.test(model, _data(), verbose=False)
    trainer.predict(model, _data())
    return calls


@pytest.mark.timeout(60)
def test_a_lambda_callback_is_called_as_lightnings(tmp_path):
    ours, theirs = _calls(fw, fw.TrainModule, tmp_path / "fw"), _calls(pl, pl.LightningModule, tmp_path / "pl")
    assert {call[0] for call in ours} == set(HOOKS)
    assert ours == theirs


def test_an_unknown_hook_name_is_refused():
    with pytest.raises(ConfigError, match="on_train_epoch_ends.*on_train_epoch_end"):
        LambdaCallback(on_train_epoch_ends=lambda trainer, module: None)
