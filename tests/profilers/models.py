"""One module and one callback, built on fw's or Lightning's base classes, so that both
frameworks profile the same code; and the data they train on."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

#: the module hooks ``Model`` overrides (each does nothing but be called)
MODEL_HOOKS = ("on_fit_start", "on_train_start", "on_train_epoch_start", "on_train_batch_start", "on_train_batch_end",
               "on_before_backward", "on_after_backward", "on_before_zero_grad", "on_before_optimizer_step",
               "on_train_epoch_end", "on_validation_batch_end", "on_validation_epoch_end", "on_before_batch_transfer",
               "on_after_batch_transfer", "lr_scheduler_step")
#: the callback hooks ``Recorder`` overrides
CALLBACK_HOOKS = ("setup", "on_train_batch_end", "on_train_epoch_end", "on_validation_epoch_end", "teardown")


def _noop(*args, **kwargs):
    return None


def _returns_batch(self, batch, dataloader_idx):
    return batch


def _lr_scheduler_step(self, scheduler, metric):
    scheduler.step()


def model_class(base: type) -> type:
    """``Model``: a linear regression on ``base`` (``fw.TrainModule`` or ``pl.LightningModule``)."""

    def __init__(self):
        base.__init__(self)
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        return F.mse_loss(self.layer(batch[0]), batch[1])

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", F.mse_loss(self.layer(batch[0]), batch[1]))

    def predict_step(self, batch, batch_idx):
        return self.layer(batch[0])

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 1, 0.5)}

    body = {"__init__": __init__, "training_step": training_step, "validation_step": validation_step,
            "test_step": validation_step, "predict_step": predict_step, "configure_optimizers": configure_optimizers, "__qualname__": "Model"}
    body.update({hook: _noop for hook in MODEL_HOOKS})
    body.update(on_before_batch_transfer=_returns_batch, on_after_batch_transfer=_returns_batch,
                lr_scheduler_step=_lr_scheduler_step)
    return type("Model", (base,), body)


def callback_class(base: type) -> type:
    """``Recorder``: a callback on ``base`` whose hooks do nothing (its ``state_key`` is ``Recorder``)."""
    return type("Recorder", (base,), {"__qualname__": "Recorder", **{hook: _noop for hook in CALLBACK_HOOKS}})


def data_class(base: type) -> type:
    """``Data``: a DataModule on ``base`` with ``loaders()``'s data."""

    def setup(self, stage):
        self.train, self.val = loaders()

    body = {"setup": setup, "train_dataloader": lambda self: self.train, "val_dataloader": lambda self: self.val,
            "teardown": _noop, "__qualname__": "Data"}
    return type("Data", (base,), body)


def loaders(train: int = 40, val: int = 24, batch_size: int = 8) -> tuple[DataLoader, DataLoader]:
    g = torch.Generator().manual_seed(0)
    make = lambda n: TensorDataset(torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g))  # noqa: E731
    return DataLoader(make(train), batch_size=batch_size), DataLoader(make(val), batch_size=batch_size)
