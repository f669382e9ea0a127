"""What the MLflow and W&B logger tests share: the Trainer's settings, a module that fails in the
middle of a fit, the module and fit that put fw's logger beside Lightning's, and the check of the
one-line error when the logger's package is not installed, and the mark that skips a test file then."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch
import torch.nn.functional as F
from toy import LinearModel, loader, regression_data

SETTINGS = dict(accelerator="cpu", devices=1, max_epochs=2, log_every_n_steps=2, enable_progress_bar=False,
                enable_model_summary=False)


class FailsAtStep3(LinearModel):
    """Raises ZeroDivisionError at global step 3 (of the 8 a fit with SETTINGS takes)."""

    def training_step(self, batch, batch_idx):
        if self.global_step == 3:
            raise ZeroDivisionError("step 3")
        return super().training_step(batch, batch_idx)


class LogsLosses:
    """The steps of the module fw's and Lightning's loggers both record (mixed into either base
    class, before it; the subclass's ``__init__`` saves its hyperparameters and calls
    ``seeded_net``): train/loss on step and epoch, val/loss, SGD at ``hparams.lr``."""

    def seeded_net(self) -> None:
        torch.manual_seed(0)
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        loss = F.mse_loss(self.net(batch[0]), batch[1])
        self.log("train/loss", loss, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val/loss", F.mse_loss(self.net(batch[0]), batch[1]))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def sides(pl, fw_logger: type, lightning_logger: type) -> tuple:
    """``(which, Trainer, Logger, module base)`` for fw's side and for Lightning's."""
    import framework as fw

    return (("fw", fw.Trainer, fw_logger, fw.TrainModule),
            ("pl", pl.Trainer, lightning_logger, pl.LightningModule))


def fit_alone(Trainer, logger, module) -> None:
    """One fit with ``logger`` as the only logger, on the same 32 samples under either Trainer."""
    trainer = Trainer(logger=logger, enable_checkpointing=False, num_sanity_val_steps=0, **SETTINGS)
    data = regression_data(32)
    trainer.fit(module, loader(data), loader(data))


def missing_package_error(monkeypatch, logger: type, package: str) -> ModuleNotFoundError:
    """Building ``logger`` as if ``package`` were not installed: one line naming the install (and
    the extra that `fw fit` names too); the error, for further checks."""
    monkeypatch.setitem(sys.modules, package, None)
    with pytest.raises(ModuleNotFoundError) as err:
        logger()
    message = str(err.value)
    assert message.startswith(f"{logger.__name__} needs the {package} package, which is not installed: pip install ")
    assert f"[{package}]" in message and "\n" not in message
    from framework.cli import _missing_extra

    assert f"[{package}]" in _missing_extra(package)  # what `fw fit` prints as its one-line error
    return err.value


def needs(package: str, logger: str) -> pytest.MarkDecorator:
    """Skips a test file when ``package`` is not installed, without importing it: every worker of
    the suite collects every file, and the package is imported by the tests that run."""
    return pytest.mark.skipif(importlib.util.find_spec(package) is None,
                              reason=f"{logger} needs {package}: pip install -e '.[{package}]'")
