"""A checkpoint is made of stateful parts that the strategy saves and loads.

- A user's own stateful object, added as ``trainer.checkpoint_parts[name]``, is saved with every
  checkpoint of a fit and given back its state on resume.
- The strategy writes and reads the file: a strategy that overrides ``save_checkpoint`` and
  ``load_checkpoint`` sees every part (and decides the format).
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader
from toy import QUIET, LinearModel, regression_data

import framework as fw
from framework.strategies.single import SingleDeviceStrategy


class Counter:
    """A user's own stateful object: counts the batches it saw."""

    def __init__(self) -> None:
        self.seen = 0
        self.loaded: dict | None = None

    def state_dict(self) -> dict:
        return {"seen": self.seen}

    def load_state_dict(self, state: dict) -> None:
        self.loaded = dict(state)
        self.seen = state["seen"]


class CountBatches(fw.Callback):
    def __init__(self, counter: Counter) -> None:
        self.counter = counter

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self.counter.seen += 1


def _trainer(tmp_path, counter: Counter, **extra) -> fw.Trainer:
    trainer = fw.Trainer(**{**QUIET, "default_root_dir": str(tmp_path), "callbacks": [CountBatches(counter)],
                            **extra})
    trainer.checkpoint_parts["counter"] = counter
    return trainer


def test_a_users_stateful_object_is_saved_and_restored_as_a_part(tmp_path):
    data = DataLoader(regression_data(32), batch_size=8)
    first = Counter()
    trainer = _trainer(tmp_path, first, max_epochs=2)
    trainer.fit(LinearModel(), data)
    trainer.save_checkpoint(tmp_path / "done.ckpt")
    assert torch.load(tmp_path / "done.ckpt", weights_only=False)["counter"] == {"seen": 8}

    again = Counter()
    _trainer(tmp_path, again, max_epochs=3).fit(LinearModel(), data, ckpt_path=str(tmp_path / "done.ckpt"))
    assert again.loaded == {"seen": 8} and again.seen == 12  # restored, then one more epoch of 4 batches


class RecordingStrategy(SingleDeviceStrategy):
    """Writes and reads through the base class, recording which parts it was handed."""

    def __init__(self) -> None:
        super().__init__()
        self.saved: list[str] = []
        self.loaded: list[str] = []

    def save_checkpoint(self, path, parts) -> None:
        self.saved = sorted([*parts.shared, *parts.per_rank])
        super().save_checkpoint(path, parts)

    def load_checkpoint(self, path, parts):
        self.loaded = sorted([*parts.shared, *parts.per_rank])
        return super().load_checkpoint(path, parts)


def test_the_strategy_saves_and_loads_every_part(tmp_path):
    data = DataLoader(regression_data(32), batch_size=8)
    strategy = RecordingStrategy()
    trainer = fw.Trainer(**{**QUIET, "strategy": strategy, "max_epochs": 1, "default_root_dir": str(tmp_path)})
    trainer.fit(LinearModel(scheduler={"interval": "epoch"}), data)
    trainer.save_checkpoint(tmp_path / "a.ckpt")
    expected = {"state_dict", "optimizer_states", "lr_schedulers", "precision", "callbacks", "loop",
                "rng", "metrics", "loader_states"}
    assert expected <= set(strategy.saved)
    resumed = RecordingStrategy()
    fw.Trainer(**{**QUIET, "strategy": resumed, "max_epochs": 2, "default_root_dir": str(tmp_path)}).fit(
        LinearModel(scheduler={"interval": "epoch"}), data, ckpt_path=str(tmp_path / "a.ckpt"))
    assert expected <= set(resumed.loaded)
