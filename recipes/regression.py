"""Synthetic linear regression: no data set dependency at all."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import framework as fw


class RegressionData(fw.DataModule):
    """y = x @ w + noise with a fixed seed; ``n`` samples of ``features`` features."""

    def __init__(self, n: int = 2048, features: int = 16, noise: float = 0.1, batch_size: int = 64, seed: int = 0):
        self.n, self.features, self.noise, self.batch_size, self.seed = n, features, noise, batch_size, seed

    def setup(self, stage: str) -> None:
        g = torch.Generator().manual_seed(self.seed)
        x = torch.randn(self.n, self.features, generator=g)
        w = torch.randn(self.features, 1, generator=g)
        y = x @ w + self.noise * torch.randn(self.n, 1, generator=g)
        split = int(self.n * 0.8)
        self.train_set = TensorDataset(x[:split], y[:split])
        self.val_set = TensorDataset(x[split:], y[split:])

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.batch_size)

    test_dataloader = val_dataloader


class Regressor(fw.TrainModule):
    """A linear model (or an MLP with ``hidden > 0``) trained with MSE."""

    def __init__(self, features: int = 16, hidden: int = 0, lr: float = 0.05):
        super().__init__()
        self.save_hyperparameters()
        self.net = (nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, 1))
                    if hidden else nn.Linear(features, 1))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.log("train/mse", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val/mse", F.mse_loss(self(x), y), sync_dist=True)

    test_step = validation_step

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams["lr"])
