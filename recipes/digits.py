"""Handwritten digits (scikit-learn's bundled 8x8 images: no download) with an MLP."""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import framework as fw


class DigitsData(fw.DataModule):
    """1,797 8x8 digit images scaled to [0, 1]; a fixed, seeded train/val/test split: the test
    set is held out from both training and the validation that picks the best checkpoint.

    Args:
        batch_size: per device; the global batch is batch_size * world size.
        val_fraction: share of the images held out for validation.
        test_fraction: share of the images held out for testing (``fw test``).
        split_seed: seed of the split (independent of the run's seed).
        drop_last: drop each epoch's last, smaller training batch (every step then trains
            batch_size samples per device, as throughput counts assume).
    """

    def __init__(self, batch_size: int = 64, val_fraction: float = 0.2, split_seed: int = 0, num_workers: int = 0,
                 drop_last: bool = False, test_fraction: float = 0.1):
        self.batch_size, self.val_fraction, self.test_fraction = batch_size, val_fraction, test_fraction
        self.split_seed, self.num_workers, self.drop_last = split_seed, num_workers, drop_last

    def setup(self, stage: str) -> None:
        x, y = load_digits()
        x = torch.tensor(x, dtype=torch.float32) / 16.0
        y = torch.tensor(y, dtype=torch.long)
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(self.split_seed))
        n_val, n_test = int(len(x) * self.val_fraction), int(len(x) * self.test_fraction)
        val, test, train = order[:n_val], order[n_val:n_val + n_test], order[n_val + n_test:]
        self.train_set = TensorDataset(x[train], y[train])
        self.val_set = TensorDataset(x[val], y[val])
        self.test_set = TensorDataset(x[test], y[test])

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, num_workers=self.num_workers,
                          drop_last=self.drop_last)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.batch_size, num_workers=self.num_workers)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.test_set, batch_size=self.batch_size, num_workers=self.num_workers)

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(self.val_set.tensors[0]), batch_size=self.batch_size)


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's ``load_digits(return_X_y=True)``: its bundled file read as it reads it, without
    importing scikit-learn (0.7 s of CPU in every process that trains on the digits); through
    ``load_digits`` itself when the file is not where scikit-learn keeps it."""
    path = bundled_digits_file()
    if path is None:
        from sklearn.datasets import load_digits as from_sklearn

        return from_sklearn(return_X_y=True)
    with gzip.open(path, "rt", encoding="utf-8") as f:
        data = np.loadtxt(f, delimiter=",")
    return data[:, :-1], data[:, -1].astype(int, copy=False)


def bundled_digits_file() -> Path | None:
    spec = importlib.util.find_spec("sklearn")  # finds the package without importing it
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz"
    return path if path.is_file() else None


class DigitsClassifier(fw.TrainModule):
    """MLP 64 -> hidden -> hidden -> 10 with dropout; accuracy from torchmetrics."""

    def __init__(self, hidden: int = 128, lr: float = 3e-3, dropout: float = 0.1, weight_decay: float = 0.0):
        super().__init__()
        self.save_hyperparameters()
        from torchmetrics.classification import MulticlassAccuracy

        self.net = nn.Sequential(
            nn.Linear(64, hidden), nn.ReLU(), nn.Dropout(dropout),
            nn.Linear(hidden, hidden), nn.ReLU(), nn.Dropout(dropout),
            nn.Linear(hidden, 10),
        )
        self.val_acc = MulticlassAccuracy(num_classes=10, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes=10, average="micro")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train/loss", loss, prog_bar=True, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val/loss", F.cross_entropy(logits, y), sync_dist=True)
        self.val_acc(logits, y)
        self.log("val/acc", self.val_acc, prog_bar=True)

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.test_acc(self(x), y)
        self.log("test/acc", self.test_acc)

    def predict_step(self, batch, batch_idx):
        return self(batch[0]).argmax(dim=1)

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=self.hparams["lr"], weight_decay=self.hparams["weight_decay"])
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(1, self.trainer.max_epochs))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "epoch"}}
