"""A stop asked for before ``min_epochs`` (or ``min_steps``) are done (a callback's ``trainer.should_stop``,
``max_time``) waits until they are, as in Lightning: the same steps and epochs on both, and
``max_time=0`` stops at once (it used to be read as no limit)."""

from __future__ import annotations

from typing import ClassVar

import pytest

import framework as fw
from lightning.modules import make_boring

pl = pytest.importorskip("pytorch_lightning")
QUIET = dict(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
             enable_model_summary=False, max_epochs=1000)


def _stops_at(trainer_cls, base, callback_base, **args) -> tuple[int, int]:
    class Stop(callback_base):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if batch_idx == 1:
                trainer.should_stop = True

    callbacks = [Stop()] if args.pop("callback", False) else []
    trainer = trainer_cls(callbacks=callbacks, **QUIET, **args)
    trainer.fit(make_boring(base)())
    return trainer.global_step, trainer.current_epoch


@pytest.mark.timeout(60)
@pytest.mark.parametrize("args", [dict(callback=True, min_epochs=3), dict(callback=True), dict(max_time={"seconds": 0}),
                                  dict(max_time={"seconds": 0}, min_epochs=2), dict(callback=True, min_steps=40),
                                  dict(callback=True, min_steps=40, min_epochs=1)])
def test_stops_wait_for_min_epochs_and_min_steps_as_lightnings_do(args):
    theirs = _stops_at(pl.Trainer, pl.LightningModule, pl.Callback, **dict(args))
    ours = _stops_at(fw.Trainer, fw.TrainModule, fw.Callback, **dict(args))
    assert ours == theirs
    assert ours[0] < 1000  # it stopped (16 batches an epoch)


def _validations_around_a_stop(trainer_cls, base, root, where: str) -> tuple[list, int, list]:
    """Validation every 3 batches; a stop asked for in training_step at step 4, or in the first
    validation's on_validation_epoch_end (as EarlyStopping asks): which validations run, and what
    ModelCheckpoint saved after them."""
    import os

    class Stopping(make_boring(base)):
        validations: ClassVar[list] = []

        def training_step(self, batch):
            if where == "step" and self.global_step == 4:
                self.trainer.should_stop = True
            return super().training_step(batch)

        def on_validation_epoch_end(self):
            if not self.trainer.sanity_checking:
                self.validations.append(self.global_step)
                self.trainer.should_stop = self.trainer.should_stop or where == "validation"

    callbacks = (fw.callbacks.ModelCheckpoint if trainer_cls is fw.Trainer else pl.callbacks.ModelCheckpoint)(
        dirpath=str(root), filename="{step}", save_top_k=-1, monitor="valid_loss")
    model = Stopping()
    model.validations = []
    trainer = trainer_cls(**{**QUIET, "max_epochs": 3, "enable_checkpointing": True}, val_check_interval=3, callbacks=[callbacks],
                          default_root_dir=str(root))
    trainer.fit(model)
    return model.validations, trainer.global_step, sorted(f for f in os.listdir(root) if f.endswith(".ckpt"))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("where", ["step", "validation"])
def test_a_stop_between_validations_validates_where_lightning_does(tmp_path, where):
    """Lightning validates once more after the batch at which a stop was asked for, and never
    twice after one batch: a stop asked for by a validation ends the epoch without another."""
    ours = _validations_around_a_stop(fw.Trainer, fw.TrainModule, tmp_path / "fw", where)
    theirs = _validations_around_a_stop(pl.Trainer, pl.LightningModule, tmp_path / "pl", where)
    assert ours == theirs and ours[0] == ([3, 5] if where == "step" else [3])
