"""One model and DataModule, written once against Lightning's API and built on either base
class (fw's ``TrainModule`` / ``DataModule`` or pytorch_lightning's), for the Tuner tests."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

#: what a trial that is too large raises: what torch raises on a CUDA device
OOM_MESSAGE = "CUDA out of memory. Tried to allocate 2.00 GiB (a test's limit)"


def regression_data(n: int = 256) -> TensorDataset:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(n, 8, generator=g)
    y = x @ torch.linspace(-1, 1, 8, dtype=torch.float32).unsqueeze(1) + 0.1 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


def make_regressor(Base):
    class Regressor(Base):
        """A small MLP on a regression; ``lr`` and ``batch_size`` as attributes, the data from
        its own ``train_dataloader()``; a batch of more than ``oom_above`` rows raises a CUDA
        out-of-memory error, as a GPU that holds that many would."""

        def __init__(self, lr: float = 0.01, batch_size: int = 8, n: int = 256, oom_above: int | None = None,
                     accumulate_loss_none_every: int = 0):
            super().__init__()
            self.lr, self.batch_size, self.n, self.oom_above = lr, batch_size, n, oom_above
            self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
            self.sizes: list[int] = []  # the rows of each training batch run, in order
            self.val_sizes: list[int] = []

        def training_step(self, batch, batch_idx):
            x, y = batch
            self.sizes.append(len(x))
            if self.oom_above is not None and len(x) > self.oom_above:
                raise torch.cuda.OutOfMemoryError(OOM_MESSAGE)
            return nn.functional.mse_loss(self.net(x), y)

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.val_sizes.append(len(x))
            if self.oom_above is not None and len(x) > self.oom_above:
                raise torch.cuda.OutOfMemoryError(OOM_MESSAGE)
            self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)

        def train_dataloader(self):
            return DataLoader(regression_data(self.n), batch_size=self.batch_size, shuffle=True)

        def val_dataloader(self):
            return DataLoader(regression_data(64), batch_size=self.batch_size)

    return Regressor


def make_data(Base):
    class Data(Base):
        """The batch size in the DataModule's hparams (``save_hyperparameters``)."""

        def __init__(self, batch_size: int = 4, n: int = 200):
            super().__init__()
            self.save_hyperparameters()

        def train_dataloader(self):
            return DataLoader(regression_data(self.hparams.n), batch_size=self.hparams.batch_size)

        def val_dataloader(self):
            return DataLoader(regression_data(64), batch_size=self.hparams.batch_size)

    return Data


def make_hparams_regressor(Base):
    class HparamsRegressor(make_regressor(Base)):
        """The learning rate as ``learning_rate`` in ``hparams`` only, the data from a DataModule."""

        def __init__(self, learning_rate: float = 0.05):
            super().__init__()
            self.save_hyperparameters()
            del self.lr

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.hparams.learning_rate)

    return HparamsRegressor
