"""Tiny models and data sets that the multi-process scripts and the in-process references share.

Scripts import this module by path (see ``helpers.PREAMBLE``); the tests import it as part of
the package, so both sides train exactly the same thing.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

import framework as fw

FIT_ARGS = dict(accelerator="cpu", logger=False, enable_checkpointing=False,
                enable_progress_bar=False, num_sanity_val_steps=0)


def regression_data(n: int = 32) -> TensorDataset:
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(n, 4, generator=g)
    y = torch.randn(n, 2, generator=g)
    return TensorDataset(x, y)


class Regressor(fw.TrainModule):
    """4 -> 8 -> 2 MLP, mean squared error, plain SGD: the sum over ranks of per-rank means,
    divided by the world size, is the mean over the global batch."""

    def __init__(self, lr: float = 0.1) -> None:
        super().__init__()
        self.lr = lr
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def fit_regressor(strategy, devices: int, batch_size: int, accumulate: int, seed: int = 0, **extra) -> dict:
    """Train ``Regressor`` for 2 epochs on an unshuffled loader; return its final state dict."""
    fw.seed_everything(seed)
    model = Regressor()
    loader = DataLoader(regression_data(), batch_size=batch_size, shuffle=False)
    trainer = fw.Trainer(devices=devices, strategy=strategy, max_epochs=2,
                         accumulate_grad_batches=accumulate, **FIT_ARGS, **extra)
    trainer.fit(model, train_dataloaders=loader)
    return {"rank": trainer.global_rank, "world_size": trainer.world_size,
            "state": {k: v.detach().clone() for k, v in model.state_dict().items()}}


class IndexData(Dataset):
    """Item i is ``(i, features_i)``, so a step can record which samples it saw."""

    def __init__(self, n: int) -> None:
        self.x = torch.randn(n, 4, generator=torch.Generator().manual_seed(7))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return torch.tensor(i), self.x[i]


class IndexRecorder(fw.TrainModule):
    """Records the sample indices of every training batch, per epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)
        self.seen: dict[int, list[int]] = {}

    def training_step(self, batch, batch_idx):
        idx, x = batch
        self.seen.setdefault(self.trainer.current_epoch, []).extend(idx.tolist())
        return self.layer(x).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def eval_data(n: int = 101) -> TensorDataset:
    g = torch.Generator().manual_seed(99)
    return TensorDataset(torch.arange(n), torch.randn(n, 4, generator=g), torch.randint(0, 3, (n,), generator=g))


class EvalClassifier(fw.TrainModule):
    """A fixed linear classifier; validation logs a torchmetrics accuracy, a synced mean loss,
    a synced sample count, and records which samples this rank evaluated."""

    def __init__(self) -> None:
        super().__init__()
        from torchmetrics.classification import MulticlassAccuracy

        torch.manual_seed(3)
        self.layer = nn.Linear(4, 3)
        self.acc = MulticlassAccuracy(num_classes=3, average="micro")
        self.seen: list[int] = []

    def validation_step(self, batch, batch_idx):
        idx, x, y = batch
        self.seen.extend(idx.tolist())
        logits = self.layer(x)
        self.acc(logits, y)
        self.log("val/acc", self.acc)
        self.log("val/loss", F.cross_entropy(logits, y), sync_dist=True)
        self.log("val/count", torch.tensor(float(len(idx))), reduce_fx="sum", sync_dist=True)

    def training_step(self, batch, batch_idx):  # pragma: no cover - never trained
        raise AssertionError

    def configure_optimizers(self):  # pragma: no cover
        return torch.optim.SGD(self.parameters(), lr=0.1)
