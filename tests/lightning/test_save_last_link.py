"""``ModelCheckpoint(save_last="link")``, as Lightning: ``last.ckpt`` is a symbolic link to the
newest checkpoint the callback saved (a file of its own where none was saved: ``save_top_k=0``),
relinked at every save point; the files, the link's target and step, and the callback's paths
equal Lightning's; a fit resumes from the link as from its target."""

from __future__ import annotations

import os

import pytest
import torch

import framework as fw
import framework.callbacks  # fw.callbacks, as pl.callbacks
from lightning.modules import make_regressor, regression_loader

pl = pytest.importorskip("pytorch_lightning")


def _model(base: type):
    class Model(make_regressor(base)):
        def validation_step(self, batch, batch_idx):
            self.log("worse", float(self.current_epoch))  # grows: no better score after epoch 0 (mode min)

    return Model


def _fit(lib, base: type, root: str, top_k: int, every: int | None, max_epochs: int = 3, ckpt_path=None):
    callback = lib.callbacks.ModelCheckpoint(dirpath=root, monitor="worse", save_top_k=top_k, save_last="link",
                                             every_n_train_steps=every)
    trainer = lib.Trainer(accelerator="cpu", max_epochs=max_epochs, logger=False, enable_progress_bar=False,
                          enable_model_summary=False, num_sanity_val_steps=0, callbacks=[callback])
    model = _model(base)()
    trainer.fit(model, regression_loader(), regression_loader(), ckpt_path=ckpt_path)
    return trainer, model, callback


def _saved(root: str, callback) -> tuple:
    last = os.path.join(root, "last.ckpt")
    target = os.path.basename(os.path.realpath(last)) if os.path.islink(last) else None
    return (sorted(f for f in os.listdir(root) if f.endswith(".ckpt")), target,
            torch.load(last, weights_only=False)["global_step"],
            os.path.basename(callback.last_model_path), os.path.basename(callback.best_model_path))


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("top_k", "every"), [(1, None), (1, 2), (-1, 2), (0, None)])
def test_save_last_link_links_as_lightnings_does(tmp_path, top_k, every):
    ours = _saved(str(tmp_path / "fw"), _fit(fw, fw.TrainModule, str(tmp_path / "fw"), top_k, every)[2])
    theirs = _saved(str(tmp_path / "pl"), _fit(pl, pl.LightningModule, str(tmp_path / "pl"), top_k, every)[2])
    assert ours == theirs
    assert (ours[1] is None) == (top_k == 0)  # a link, but a file of its own where no other file is saved


@pytest.mark.timeout(60)
def test_a_fit_resumes_from_the_link_as_from_its_target(tmp_path):
    root = str(tmp_path / "ck")
    _fit(fw, fw.TrainModule, root, 1, None, max_epochs=2)
    assert os.path.islink(os.path.join(root, "last.ckpt"))
    target = os.path.realpath(os.path.join(root, "last.ckpt"))
    via_link = _fit(fw, fw.TrainModule, str(tmp_path / "a"), 1, None, max_epochs=4, ckpt_path=os.path.join(root, "last.ckpt"))
    direct = _fit(fw, fw.TrainModule, str(tmp_path / "b"), 1, None, max_epochs=4, ckpt_path=target)
    assert via_link[0].global_step == direct[0].global_step == 16
    for a, b in zip(via_link[1].parameters(), direct[1].parameters(), strict=True):
        assert torch.equal(a, b)
