"""With ``limit_*_batches`` below a loader's length, fw reads the batches it runs and not one
more, as Lightning does: a batch read past the limit would draw what a random transform draws
(and a resumed or compared run would see other data)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import framework as fw
from lightning.modules import make_boring

pl = pytest.importorskip("pytorch_lightning")


class Counting(Dataset):
    def __init__(self) -> None:
        self.read = 0

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i):
        self.read += 1
        return torch.randn(32)


def _samples_read(trainer_cls, base) -> list[int]:
    args = dict(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                enable_model_summary=False, use_distributed_sampler=False)
    counts = []
    for fn, limits in [("fit", dict(max_epochs=2, limit_train_batches=3, limit_val_batches=2)),
                       ("validate", dict(limit_val_batches=2)), ("test", dict(limit_test_batches=1)),
                       ("predict", dict(limit_predict_batches=2))]:
        data = Counting()
        trainer = trainer_cls(**args, **limits)
        loaders = (DataLoader(data, batch_size=4), DataLoader(Counting(), batch_size=4)) if fn == "fit" \
            else (DataLoader(data, batch_size=4),)
        getattr(trainer, fn)(make_boring(base)(), *loaders)
        counts.append(data.read)
    return counts


@pytest.mark.timeout(60)
def test_no_batch_is_read_past_the_limit_as_in_lightning():
    theirs = _samples_read(pl.Trainer, pl.LightningModule)
    ours = _samples_read(fw.Trainer, fw.TrainModule)
    assert ours == theirs == [24, 8, 4, 8]  # 2 epochs of 3 batches of 4; 2; 1; 2 batches


@pytest.mark.parametrize("limits", [dict(limit_val_batches=0.1), dict(limit_train_batches=0.05),
                                    dict(overfit_batches=0.01)], ids=["val", "train", "overfit"])
def test_a_fraction_that_leaves_no_batch_is_refused_as_lightning_refuses_it(limits):
    """0.1 of 16 validation batches is not one batch: Lightning refuses to run the stage with
    none, naming the argument and the smallest fraction that would read one, and so does fw."""
    from lightning_fabric.utilities.exceptions import MisconfigurationException

    from framework.errors import ConfigError

    args = dict(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                enable_model_summary=False, max_epochs=1, **limits)
    name = next(iter(limits)) if "overfit_batches" not in limits else "limit_(val|train)_batches"
    for trainer_cls, base, error in ((pl.Trainer, pl.LightningModule, MisconfigurationException),
                                     (fw.Trainer, fw.TrainModule, ConfigError)):
        model = make_boring(base)()  # 16 training batches, 5 validation batches of 64 / 2
        with pytest.raises(error, match=name):
            trainer_cls(**args).fit(model)


def test_limit_train_batches_0_runs_the_sanity_check_alone_as_in_lightning():
    """No training batch: the sanity check runs, no epoch is counted, nothing is logged (the
    hooks called are compared with Lightning's in test_hook_calls.py)."""
    ends = []
    for trainer_cls, base in ((pl.Trainer, pl.LightningModule), (fw.Trainer, fw.TrainModule)):
        trainer = trainer_cls(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                              enable_progress_bar=False, enable_model_summary=False, max_epochs=3,
                              limit_train_batches=0)
        trainer.fit(make_boring(base)())
        ends.append((trainer.current_epoch, trainer.global_step, dict(trainer.callback_metrics)))
    assert ends[0] == ends[1] == (0, 0, {})
