"""A mid-epoch resume reaches its position without loading the samples it skips (so its cost
does not grow with the position: see benchmarks/bench_resume.py), and a loader that keeps its
own state (``state_dict``/``load_state_dict``, as torchdata's StatefulDataLoader) is saved and
restored instead of being skipped through."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, Dataset
from toy import QUIET, DropoutMLP, regression_data

import framework as fw


class Counting(Dataset):
    def __init__(self, n=320):
        self.base, self.loaded = regression_data(n), 0

    def __len__(self):
        return len(self.base)

    def __getitem__(self, i):
        self.loaded += 1
        return self.base[i]


def fit(root, loader, ckpt=None, **limits):
    fw.seed_everything(3)
    model = DropoutMLP()
    trainer = fw.Trainer(**QUIET, default_root_dir=str(root), **limits)
    trainer.fit(model, loader, ckpt_path=ckpt)
    return trainer, model


def test_a_mid_epoch_resume_loads_none_of_the_skipped_samples(tmp_path):
    data = Counting()
    _, straight = fit(tmp_path, DataLoader(data, batch_size=8, shuffle=True), max_epochs=1)
    stopped, _ = fit(tmp_path, DataLoader(data, batch_size=8, shuffle=True), max_steps=30)
    stopped.save_checkpoint(tmp_path / "at30.ckpt")
    data.loaded = 0
    _, resumed = fit(tmp_path, DataLoader(data, batch_size=8, shuffle=True), ckpt=str(tmp_path / "at30.ckpt"),
                     max_epochs=1)
    assert data.loaded == (40 - 30) * 8  # only the batches still to train on
    for a, b in zip(straight.state_dict().values(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b)


class Stateful(DataLoader):
    """Keeps its own position, as torchdata's StatefulDataLoader does."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.position, self.resume_at, self.restored = 0, 0, []

    def __iter__(self):
        batches = super().__iter__()  # made at once, as a DataLoader's iterator is
        start, self.resume_at = self.resume_at, 0
        self.position = start
        return self._from(batches, start)

    def _from(self, batches, start):
        for i, batch in enumerate(batches):
            if i >= start:
                self.position = i + 1
                yield batch

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.restored.append(dict(state))
        self.resume_at = state["position"]


def test_a_stateful_loader_is_saved_and_restored(tmp_path):
    data = regression_data(320)
    _, straight = fit(tmp_path, Stateful(data, batch_size=8), max_epochs=1)
    stopped, _ = fit(tmp_path, Stateful(data, batch_size=8), max_steps=12)
    stopped.save_checkpoint(tmp_path / "at12.ckpt")
    loader = Stateful(data, batch_size=8)
    _, resumed = fit(tmp_path, loader, ckpt=str(tmp_path / "at12.ckpt"), max_epochs=1)
    assert loader.restored == [{"position": 12}]
    for a, b in zip(straight.state_dict().values(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_loaders_with_workers_are_drawn_and_dropped_not_skipped_by_index():
    from framework.data import skipping_first_batches

    data = regression_data(32)
    assert skipping_first_batches(DataLoader(data, batch_size=8), 2) is not None
    # worker processes seed their own RNG and take batches in turn: skipping would change both
    assert skipping_first_batches(DataLoader(data, batch_size=8, num_workers=2), 2) is None


class PlateauMLP(DropoutMLP):
    """Adam with ReduceLROnPlateau on the validation loss (read at each epoch's end), and a count
    of the validations that ran."""

    def __init__(self):
        super().__init__()
        self.validations = 0

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.log("train/loss", loss, on_epoch=True)
        return loss

    def on_validation_epoch_end(self):
        self.validations += not self.trainer.sanity_checking

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=1e-2)
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.5, patience=0, threshold=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": plateau, "monitor": "val/loss"}}


def test_a_checkpoint_written_at_the_epoch_end_validation_resumes_after_it(tmp_path):
    """ModelCheckpoint(save_on_train_epoch_end=False) writes at the end of the epoch-end validation,
    before the epoch's end hooks: the resumed fit does not run that validation again (nor log it
    again), and its epoch end reads the saved validation values (the plateau scheduler steps on
    them), so it ends where the fit that never stopped ends."""
    from framework.callbacks import ModelCheckpoint

    def fit(ckpt=None):
        fw.seed_everything(5)
        model = PlateauMLP()
        saver = ModelCheckpoint(dirpath=tmp_path / "ck", save_on_train_epoch_end=False, save_top_k=-1,
                                filename="{epoch}")
        trainer = fw.Trainer(**{**QUIET, "enable_checkpointing": True}, max_epochs=3, callbacks=[saver],
                             default_root_dir=str(tmp_path))
        data = regression_data(40)
        trainer.fit(model, DataLoader(data, batch_size=8, shuffle=True), DataLoader(data, batch_size=16), ckpt_path=ckpt)
        return trainer, model

    straight_trainer, straight = fit()
    resumed_trainer, resumed = fit(str(tmp_path / "ck" / "epoch=1.ckpt"))
    assert straight.validations == 3 and resumed.validations == 1  # epoch 2's: epoch 1's was in the checkpoint
    assert resumed_trainer.optimizers[0].param_groups[0]["lr"] == straight_trainer.optimizers[0].param_groups[0]["lr"]
    for key, value in straight.state_dict().items():
        assert torch.equal(resumed.state_dict()[key], value), key
    assert resumed_trainer.callback_metrics.keys() == straight_trainer.callback_metrics.keys()
