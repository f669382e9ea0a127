"""``save_hyperparameters`` and ``self.log`` as Lightning's, found by a side-by-side sweep (fw and
pytorch_lightning on the same module): the arguments are collected from the ``__init__`` chain as
Lightning collects them (called from a helper or a lambda, or from a base class whose subclass
has more arguments: fw saved nothing, or the base's alone), a checkpoint keeps tuples, dtypes and
devices as they were (fw made them lists and text), a sub-module among them is warned about;
``self.log(on_step=False, on_epoch=False)`` is refused (fw dropped the value);
``num_sanity_val_batches`` counts every batch for ``num_sanity_val_steps=-1``; a checkpoint
file gets the mode any new file gets (fw's were 0600)."""

from __future__ import annotations

import os
import stat

import pytest
import torch
from torch import nn

import framework as fw
from framework.errors import ConfigError
from lightning.modules import QUIET, make_regressor, regression_loader

pl = pytest.importorskip("pytorch_lightning")
SIDES = [("fw", fw, fw.TrainModule), ("lightning", pl, pl.LightningModule)]


def _hparams_models(Base):
    class ByHelper(make_regressor(Base)):
        def __init__(self, lr: float = 0.1, hidden: int = 8, act: str = "relu"):
            super().__init__()
            self._record()

        def _record(self):
            self.save_hyperparameters()

    class ByLambda(make_regressor(Base)):
        def __init__(self, lr: float = 0.1, hidden: int = 8):
            super().__init__()
            (lambda: self.save_hyperparameters())()

    class BaseSaves(make_regressor(Base)):
        def __init__(self, lr: float = 0.1):
            super().__init__()
            self.save_hyperparameters()

    class Child(BaseSaves):
        def __init__(self, width: int = 3, lr: float = 0.1):
            super().__init__(lr)

    class Typed(make_regressor(Base)):
        def __init__(self, shape: tuple = (3, 4), dtype: torch.dtype = torch.float64,
                     nested: dict | None = None):
            super().__init__()
            self.save_hyperparameters()

    return {"helper": ByHelper(lr=0.3, hidden=5, act="gelu"), "lambda": ByLambda(lr=0.2, hidden=4),
            "base class saves": Child(width=7, lr=0.3), "typed": Typed(nested={"pair": (1, (2, 3))})}


@pytest.mark.timeout(60)
def test_save_hyperparameters_collects_the_init_chain_and_checkpoints_keep_their_types(tmp_path):
    seen = {}
    for name, lib, base in SIDES:
        seen[name] = {}
        for case, model in _hparams_models(base).items():
            path = tmp_path / f"{name}-{case.replace(' ', '_')}.ckpt"
            trainer = lib.Trainer(**{**QUIET, "max_epochs": 1, "logger": False})
            trainer.fit(model, regression_loader())
            trainer.save_checkpoint(path)
            saved = torch.load(path, weights_only=False)["hyper_parameters"]
            loaded = type(model).load_from_checkpoint(path)
            seen[name][case] = (dict(model.hparams), dict(saved), dict(loaded.hparams))
    assert seen["fw"] == seen["lightning"]
    assert seen["fw"]["helper"][0] == {"lr": 0.3, "hidden": 5, "act": "gelu"}
    assert seen["fw"]["base class saves"][0] == {"lr": 0.3, "width": 7}
    assert seen["fw"]["typed"][2]["nested"]["pair"] == (1, (2, 3))


def test_a_sub_module_among_the_hyperparameters_is_warned_about_as_in_lightning():
    for base in (fw.TrainModule, pl.LightningModule):
        class WithBackbone(base):
            def __init__(self, backbone: nn.Module):
                super().__init__()
                self.save_hyperparameters()
                self.backbone = backbone

        with pytest.warns(UserWarning, match=r"'backbone' is an instance of `nn.Module`.*ignore=\['backbone'\]"):
            WithBackbone(nn.Linear(2, 2))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("options", [dict(on_step=False), dict(on_step=False, on_epoch=False)])
def test_a_value_logged_nowhere_is_refused_as_in_lightning(options):
    for lib, base, error in ((fw, fw.TrainModule, ConfigError), (pl, pl.LightningModule, Exception)):
        class LogsNowhere(make_regressor(base)):
            def training_step(self, batch, batch_idx):
                loss = self.mse(batch)
                self.log("v", loss, **options)
                return loss

        with pytest.raises(error, match="on_step=False, on_epoch=False"):
            lib.Trainer(**{**QUIET, "logger": False}).fit(LogsNowhere(), regression_loader())


@pytest.mark.timeout(60)
def test_num_sanity_val_batches_counts_every_batch_for_minus_one_as_in_lightning():
    seen = []
    for lib, base in ((fw, fw.TrainModule), (pl, pl.LightningModule)):
        class Validated(make_regressor(base)):
            def validation_step(self, batch, batch_idx):
                self.log("val_loss", self.mse(batch))

        trainer = lib.Trainer(**{**QUIET, "logger": False, "max_epochs": 1, "num_sanity_val_steps": -1})
        trainer.fit(Validated(), regression_loader(), regression_loader(8))
        seen.append(list(trainer.num_sanity_val_batches))
    assert seen[0] == seen[1] == [2]


@pytest.mark.timeout(60)
def test_a_checkpoint_file_gets_the_mode_a_new_file_gets(tmp_path):
    old = os.umask(0o022)
    try:
        modes = []
        for lib, base in ((fw, fw.TrainModule), (pl, pl.LightningModule)):
            trainer = lib.Trainer(**{**QUIET, "logger": False, "max_epochs": 1})
            trainer.fit(make_regressor(base)(), regression_loader())
            path = tmp_path / f"{lib.__name__}.ckpt"
            trainer.save_checkpoint(path)
            modes.append(stat.S_IMODE(path.stat().st_mode))
    finally:
        os.umask(old)
    assert modes[0] == modes[1] == 0o644


def test_a_module_built_inside_another_modules_init_keeps_its_own_arguments():
    # Lightning 2.6 walks on into the outer module's __init__ and records its arguments too (the
    # outer values winning: Inner.load_from_checkpoint then fails on `hidden`); fw stops at
    # the frames of another object
    class Inner(fw.TrainModule):
        def __init__(self, lr: float = 1.0, depth: int = 2):
            super().__init__()
            self.save_hyperparameters()

    class ByName(fw.TrainModule):
        def __init__(self, a: int = 1):
            fw.TrainModule.__init__(self)
            self.save_hyperparameters()

    class Outer(fw.TrainModule):
        def __init__(self, lr: float = 0.1, hidden: int = 5):
            super().__init__()
            self.inner, self.by_name = Inner(lr=1.0), ByName(a=2)
            self.save_hyperparameters()

    outer = Outer()
    assert dict(outer.inner.hparams) == {"lr": 1.0, "depth": 2} and dict(outer.by_name.hparams) == {"a": 2}
    assert dict(outer.hparams) == {"lr": 0.1, "hidden": 5}
