"""Lightning-style modules written once, built on either base class: ``make_*(Base)`` with
``Base`` fw's ``TrainModule`` or pytorch_lightning's ``LightningModule``. The code inside uses
only Lightning's API, as a user's LightningModule does. Their data, and the quiet Trainer
settings (``QUIET``) the tests that compare fw with Lightning share, are here too."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def gan_data(n: int = 64) -> TensorDataset:
    """Points on a ring, each with its own noise vector (so that ranks draw no noise)."""
    g = torch.Generator().manual_seed(3)
    angle = torch.rand(n, generator=g) * 6.2832
    x = torch.stack([angle.cos(), angle.sin()], 1) + 0.05 * torch.randn(n, 2, generator=g)
    z = torch.randn(n, 4, generator=g)
    return TensorDataset(x, z)


def gan_loader(batch_size: int, n: int = 64) -> DataLoader:
    return DataLoader(gan_data(n), batch_size=batch_size, shuffle=False)


def make_gan(Base):
    class GAN(Base):
        """Lightning's basic GAN recipe: two optimizers, toggled, manual backward and steps,
        the discriminator's gradients clipped, both schedulers stepped by the module."""

        def __init__(self, lr: float = 0.01, clip: float = 0.5):
            super().__init__()
            self.save_hyperparameters()
            self.automatic_optimization = False
            self.generator = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))
            self.discriminator = nn.Sequential(nn.Linear(2, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))

        def training_step(self, batch, batch_idx):
            x, z = batch
            opt_g, opt_d = self.optimizers()
            ones, zeros = torch.ones(len(x), 1, device=x.device), torch.zeros(len(x), 1, device=x.device)

            self.toggle_optimizer(opt_g)
            g_loss = F.binary_cross_entropy_with_logits(self.discriminator(self.generator(z)), ones)
            self.manual_backward(g_loss)
            opt_g.step()
            opt_g.zero_grad()
            self.untoggle_optimizer(opt_g)

            self.toggle_optimizer(opt_d)
            fake = self.generator(z).detach()
            d_loss = (F.binary_cross_entropy_with_logits(self.discriminator(x), ones)
                      + F.binary_cross_entropy_with_logits(self.discriminator(fake), zeros)) / 2
            self.manual_backward(d_loss)
            self.clip_gradients(opt_d, gradient_clip_val=self.hparams.clip, gradient_clip_algorithm="norm")
            opt_d.step()
            opt_d.zero_grad()
            self.untoggle_optimizer(opt_d)
            self.log_dict({"g_loss": g_loss, "d_loss": d_loss}, prog_bar=True)

        def on_train_epoch_end(self):
            for scheduler in self.lr_schedulers():
                scheduler.step()

        def configure_optimizers(self):
            lr = self.hparams.learning_rate if "learning_rate" in self.hparams else self.hparams.lr
            opt_g = torch.optim.Adam(self.generator.parameters(), lr=lr, betas=(0.5, 0.999))
            opt_d = torch.optim.Adam(self.discriminator.parameters(), lr=lr, betas=(0.5, 0.999))
            steps = [torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.5) for o in (opt_g, opt_d)]
            return [opt_g, opt_d], steps

    return GAN


def make_accumulating(Base, every: int = 2):
    class Accumulating(Base):
        """Manual accumulation: a backward every batch, a step every ``every`` batches."""

        def __init__(self):
            super().__init__()
            self.automatic_optimization = False
            self.net = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 1))

        def training_step(self, batch, batch_idx):
            x, z = batch
            opt = self.optimizers()
            loss = F.mse_loss(self.net(x), z[:, :1]) / every
            self.manual_backward(loss)
            if (batch_idx + 1) % every == 0:
                opt.step()
                opt.zero_grad()
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.net.parameters(), lr=0.1, momentum=0.9)

    return Accumulating


class RandomDataset(torch.utils.data.Dataset):
    """Lightning's bug-report template data: ``length`` random vectors of ``size``."""

    def __init__(self, size: int = 32, length: int = 64, seed: int = 5):
        self.data = torch.randn(length, size, generator=torch.Generator().manual_seed(seed))

    def __getitem__(self, index):
        return self.data[index]

    def __len__(self):
        return len(self.data)


def make_boring(Base):
    class BoringModel(Base):
        """Lightning's bug-report template, with the idioms ports trip over: attribute hparams,
        the module's own dataloaders and setup, training_step without batch_idx, an epoch
        scheduler, validation and test steps that log."""

        def __init__(self, learning_rate: float = 0.1, batch_size: int = 4):
            super().__init__()
            self.save_hyperparameters()
            self.layer = nn.Linear(32, 2)
            self.setup_stages = []

        def forward(self, x):
            return self.layer(x)

        def setup(self, stage):
            self.setup_stages.append(stage)
            self.train_set, self.val_set = RandomDataset(seed=5), RandomDataset(length=20, seed=6)

        def train_dataloader(self):
            return DataLoader(self.train_set, batch_size=self.hparams.batch_size, shuffle=True)

        def val_dataloader(self):
            return DataLoader(self.val_set, batch_size=self.hparams.batch_size)

        def test_dataloader(self):
            return DataLoader(self.val_set, batch_size=self.hparams.batch_size)

        def training_step(self, batch):
            loss = self(batch).pow(2).mean()
            self.log("train_loss", loss, prog_bar=True)
            return {"loss": loss}

        def validation_step(self, batch, batch_idx):
            self.log("valid_loss", self(batch).pow(2).mean())

        def test_step(self, batch, batch_idx):
            self.log("test_loss", self(batch).pow(2).mean())

        def configure_optimizers(self):
            opt = torch.optim.SGD(self.layer.parameters(), lr=self.hparams.learning_rate)
            return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)}

    return BoringModel


#: A quiet single-process run with no checkpoints and no sanity check, on fw's Trainer or Lightning's.
QUIET = dict(accelerator="cpu", devices=1, max_epochs=2, enable_checkpointing=False, enable_progress_bar=False,
             enable_model_summary=False, num_sanity_val_steps=0)


def sum_data(n: int) -> TensorDataset:
    """``n`` random 3-vectors (seed 0), each with its sum as the target."""
    x = torch.randn(n, 3, generator=torch.Generator().manual_seed(0))
    return TensorDataset(x, x.sum(1, keepdim=True))


def make_summing(Base, lr: float):
    class Summing(Base):
        """A seeded ``Linear(3, 1)`` that learns ``sum_data``'s sums by SGD at ``lr``; the
        subclass's steps log (``self.mse(batch)`` is the loss)."""

        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Linear(3, 1)

        def mse(self, batch):
            return F.mse_loss(self.net(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=lr)

    return Summing


def regression_loader(n: int = 16, batch_size: int = 4) -> DataLoader:
    """``n`` random 4-vectors with random 1-D targets (seed 0), in batches of ``batch_size``."""
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g)),
                      batch_size=batch_size)


def make_regressor(Base):
    class Regressor(Base):
        """A seeded ``Linear(4, 1)`` (``self.layer``) fitting ``regression_loader``'s targets by
        SGD at 0.1; ``self.mse(batch)`` is the loss, for subclasses' steps that log."""

        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.layer = nn.Linear(4, 1)

        def mse(self, batch):
            return F.mse_loss(self.layer(batch[0]), batch[1])

        def training_step(self, batch, batch_idx):
            return self.mse(batch)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Regressor
