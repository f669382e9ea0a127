"""A stop asked for before ``min_epochs`` (or ``min_steps``) are done (a callback's ``trainer.should_stop``,
``max_time``) waits until they are, as in Lightning: the same steps and epochs on both, and
``max_time=0`` stops at once (it used to be read as no limit)."""

from __future__ import annotations

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
