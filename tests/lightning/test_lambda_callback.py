"""``LambdaCallback`` (a callback made of functions) calls what Lightning's calls, in the same
order with the same arguments' kinds; an unknown hook name is refused. A hook set on any
callback instance (as LambdaCallback sets them) is called, as Lightning calls it."""

from __future__ import annotations

import pytest

import framework as fw
from framework.callbacks import LambdaCallback
from framework.errors import ConfigError
from lightning.modules import make_regressor, regression_loader

pl = pytest.importorskip("pytorch_lightning")

HOOKS = ["setup", "teardown", "on_fit_start", "on_fit_end", "on_sanity_check_start", "on_sanity_check_end",
         "on_train_batch_start", "on_train_batch_end", "on_train_epoch_start", "on_train_epoch_end",
         "on_validation_epoch_start", "on_validation_epoch_end", "on_validation_batch_end", "on_train_start",
         "on_train_end", "on_validation_start", "on_validation_end", "on_save_checkpoint", "on_before_backward",
         "on_after_backward", "on_before_optimizer_step", "on_before_zero_grad", "on_test_start", "on_test_end",
         "on_predict_batch_end"]


def _calls(lib, base: type, tmp_path) -> list[tuple]:
    calls: list[tuple] = []

    def recorder(name: str):
        return lambda trainer, module, *rest, **named: calls.append((name, trainer.global_step, len(rest), sorted(named)))

    class Model(make_regressor(base)):
        def validation_step(self, batch, batch_idx):
            self.log("val_loss", self.mse(batch))

        def test_step(self, batch, batch_idx):
            pass

        def predict_step(self, batch, batch_idx):
            return self.layer(batch[0])

    callback = lib.callbacks.LambdaCallback(**{name: recorder(name) for name in HOOKS})
    trainer = lib.Trainer(accelerator="cpu", devices=1, max_epochs=2, logger=False, enable_progress_bar=False,
                          enable_model_summary=False, num_sanity_val_steps=1, default_root_dir=str(tmp_path),
                          callbacks=[callback, lib.callbacks.ModelCheckpoint(dirpath=str(tmp_path / "ck"))])
    model = Model()
    trainer.fit(model, regression_loader(8), regression_loader(8))
    trainer.test(model, regression_loader(8), verbose=False)
    trainer.predict(model, regression_loader(8))
    return calls


@pytest.mark.timeout(60)
def test_a_lambda_callback_is_called_as_lightnings(tmp_path):
    ours, theirs = _calls(fw, fw.TrainModule, tmp_path / "fw"), _calls(pl, pl.LightningModule, tmp_path / "pl")
    assert {call[0] for call in ours} == set(HOOKS)
    assert ours == theirs


def test_an_unknown_hook_name_is_refused():
    with pytest.raises(ConfigError, match=r"on_train_epoch_ends.*on_train_epoch_end"):
        LambdaCallback(on_train_epoch_ends=lambda trainer, module: None)
