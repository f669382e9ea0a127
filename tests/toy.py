"""Small models and data shared by the tests."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

import framework as fw
import framework.loggers as fw_loggers

QUIET = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, accelerator="cpu", devices=1)


def regression_data(n: int = 64, features: int = 4, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    y = x @ torch.randn(features, 1, generator=g) + 0.1 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


class IndexedData(Dataset):
    """Returns (x, y, index) so a test can see which samples a rank drew."""

    def __init__(self, n: int = 40, features: int = 4):
        self.base = regression_data(n, features)

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i):
        x, y = self.base[i]
        return x, y, i


class LinearModel(fw.TrainModule):
    """Linear regression with SGD; logs its loss each step."""

    def __init__(self, features: int = 4, lr: float = 0.1, optimizer: str = "sgd", scheduler: dict | None = None):
        super().__init__()
        self.save_hyperparameters()
        torch.manual_seed(0)
        self.net = nn.Linear(features, 1)

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch[0], batch[1]
        loss = F.mse_loss(self(x), y)
        self.log("train/loss", loss, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch[0], batch[1]
        self.log("val/loss", F.mse_loss(self(x), y))

    def configure_optimizers(self):
        opt_cls = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam}[self.hparams["optimizer"]]
        optimizer = opt_cls(self.parameters(), lr=self.hparams["lr"])
        spec = self.hparams["scheduler"]
        if not spec:
            return optimizer
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=spec.get("gamma", 0.5))
        return {"optimizer": optimizer,
                "lr_scheduler": {"scheduler": scheduler, "interval": spec["interval"], "frequency": spec.get("frequency", 1)}}


class DropoutMLP(fw.TrainModule):
    """An MLP with dropout, Adam and a step LR schedule: every RNG a resume must restore."""

    def __init__(self, features: int = 4, hidden: int = 16):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Dropout(0.3), nn.Linear(hidden, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val/loss", F.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=1e-2)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.7)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def loader(dataset, batch_size: int = 8, shuffle: bool = False) -> DataLoader:
    return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle)


class RaisesInStep(LinearModel):
    """For the CLI test: an error in user code keeps its traceback."""

    def training_step(self, batch, batch_idx):
        raise ZeroDivisionError("user code failed here")


class ToyData(fw.DataModule):
    def __init__(self, n: int = 32, batch_size: int = 8):
        self.n, self.batch_size = n, batch_size

    def setup(self, stage):
        self.data = regression_data(self.n)

    def train_dataloader(self):
        return loader(self.data, self.batch_size)

    def val_dataloader(self):
        return loader(self.data, self.batch_size)


class RecordingLogger(fw_loggers.Logger):
    """A real Logger that keeps every ``log_metrics`` call as ``(step, {name: value})``."""

    def __init__(self) -> None:
        super().__init__(name="")
        self.rows: list[tuple[int, dict]] = []

    def log_metrics(self, metrics, step):
        self.rows.append((step, dict(metrics)))

    def log_hyperparams(self, params):
        pass


def freezing_script(strategy: dict, pause: float = 0.0) -> str:
    """A 2-rank fit (``strategy``) whose rank 1 SIGSTOPs itself at batch 2: it stops answering
    without dying, and the other rank must end the job after the timeout. ``pause``: rank 0
    sleeps that long at batch 1 first (rank 1 waits for it in a collective, then goes on)."""
    import textwrap

    return textwrap.dedent(f"""
        import os, signal, time
        import framework as fw
        from toy import LinearModel, loader, regression_data

        class Freezes(LinearModel):
            def training_step(self, batch, batch_idx):
                if self.global_rank == 0 and batch_idx == 1:
                    time.sleep({pause!r})
                if self.global_rank == 1 and batch_idx == 2:
                    os.kill(os.getpid(), signal.SIGSTOP)
                return super().training_step(batch, batch_idx)

        trainer = fw.Trainer(accelerator="cpu", devices=2, strategy={strategy!r}, max_epochs=1,
                             logger=False, enable_checkpointing=False, enable_progress_bar=False)
        trainer.fit(Freezes(), loader(regression_data(32), 4))
    """)

