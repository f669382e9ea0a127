"""Weights-only checkpoints, as Lightning's: ``trainer.save_checkpoint(path, weights_only=True)``
and ``ModelCheckpoint(save_weights_only=True)`` write the same keys as Lightning's (the weights,
progress, hyperparameters; no optimizer, scheduler or callback states), run only the module's
``on_save_checkpoint``, load with ``load_from_checkpoint`` and in ``test(ckpt_path=...)``, and a
fit refuses to resume from one (it would go on with fresh optimizers), for fw's and Lightning's
files alike."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import framework as fw
from framework.checkpointing.file import load_checkpoint
from framework.errors import CheckpointError, ConfigError

pl = pytest.importorskip("pytorch_lightning")


def _data() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g)), batch_size=4)


def _module(base: type, hooks: list):
    class Model(base):
        def __init__(self, lr: float = 0.1):
            super().__init__()
            self.save_hyperparameters()
            torch.manual_seed(0)
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            return torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])

        def test_step(self, batch, batch_idx):
            self.log("test_loss", torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1]))

        def configure_optimizers(self):
            opt = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
            return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 1)}

        def on_save_checkpoint(self, checkpoint):
            hooks.append("module")

    return Model


def _run(lib, base: type, tmp_path) -> tuple:
    hooks: list[str] = []

    class Noting(lib.Callback):
        def on_save_checkpoint(self, trainer, module, checkpoint):
            hooks.append("callback")

    Model = _module(base, hooks)
    every_epoch = lib.callbacks.ModelCheckpoint(dirpath=str(tmp_path / "ck"), save_weights_only=True,
                                                filename="{epoch}", save_top_k=-1)
    trainer = lib.Trainer(accelerator="cpu", devices=1, max_epochs=2, logger=False, enable_progress_bar=False,
                          enable_model_summary=False, default_root_dir=str(tmp_path), callbacks=[every_epoch, Noting()])
    model = Model()
    trainer.fit(model, _data())
    saved_during_fit = list(hooks)
    hooks.clear()
    trainer.save_checkpoint(str(tmp_path / "weights.ckpt"), weights_only=True)
    saved_after = list(hooks)
    loaded = Model.load_from_checkpoint(str(tmp_path / "weights.ckpt"))
    tested = trainer.test(Model(lr=0.5), _data(), ckpt_path=str(tmp_path / "ck" / "epoch=1.ckpt"), verbose=False)
    same = all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), model.state_dict().values(), strict=True))
    return saved_during_fit, saved_after, same, loaded.hparams.lr, tested[0]["test_loss"]


@pytest.mark.timeout(90)
def test_weights_only_checkpoints_hold_and_do_what_lightnings_do(tmp_path):
    ours, theirs = _run(fw, fw.TrainModule, tmp_path / "fw"), _run(pl, pl.LightningModule, tmp_path / "pl")
    assert ours[:4] == theirs[:4] == (["module", "module"], ["module"], True, 0.1)
    assert ours[4] == pytest.approx(theirs[4], abs=1e-6)
    for name in ("weights.ckpt", "ck/epoch=1.ckpt"):
        fw_keys = set(load_checkpoint(tmp_path / "fw" / name))
        pl_keys = set(torch.load(tmp_path / "pl" / name, weights_only=False))
        for key in ("state_dict", "epoch", "global_step", "hyper_parameters"):
            assert key in fw_keys and key in pl_keys
        for key in ("optimizer_states", "lr_schedulers", "callbacks"):
            assert key not in fw_keys and key not in pl_keys
        assert not {"run_id", "fit_index", "slurm_job_id"} & fw_keys  # a restarted job never resumes from it
        assert "fw_weights_only" in fw_keys


@pytest.mark.timeout(60)
def test_a_fit_refuses_to_resume_from_a_weights_only_checkpoint_as_lightning_does(tmp_path):
    hooks: list[str] = []
    Model = _module(fw.TrainModule, hooks)
    trainer = fw.Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, default_root_dir=str(tmp_path))
    trainer.fit(Model(), _data())
    trainer.save_checkpoint(tmp_path / "weights.ckpt", weights_only=True)
    PlModel = _module(pl.LightningModule, hooks)
    pl_trainer = pl.Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False)
    pl_trainer.fit(PlModel(), _data())
    pl_trainer.save_checkpoint(tmp_path / "pl_weights.ckpt", weights_only=True)
    for path in (tmp_path / "weights.ckpt", tmp_path / "pl_weights.ckpt"):
        model = Model()
        before = [p.detach().clone() for p in model.parameters()]
        again = fw.Trainer(accelerator="cpu", max_epochs=2, logger=False, enable_checkpointing=False,
                           enable_progress_bar=False, default_root_dir=str(tmp_path))
        with pytest.raises(CheckpointError, match=r"holds the weights alone.*load_from_checkpoint"):
            again.fit(model, _data(), ckpt_path=str(path))
        assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))  # left as it was
    with pytest.raises(KeyError, match="contains only the model"):  # Lightning refuses it too
        pl.Trainer(accelerator="cpu", max_epochs=2, logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False).fit(
            PlModel(), _data(), ckpt_path=str(tmp_path / "pl_weights.ckpt"))
    with pytest.raises(ConfigError, match="storage_options"):
        trainer.save_checkpoint(tmp_path / "x.ckpt", storage_options={"a": 1})
