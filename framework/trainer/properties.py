"""The Trainer's read-only views with Lightning's names: the callbacks it holds, where the run
stands, the devices and the data. Kept apart from ``trainer.py`` so that the Trainer's own code
(its arguments, ``_run``) reads on its own; every name here means what Lightning's does."""

from __future__ import annotations

import math
from typing import Any


class TrainerProperties:
    """Mixed into ``Trainer``."""

    # -- callbacks ------------------------------------------------------------------------------
    @property
    def checkpoint_callbacks(self) -> list:
        from framework.callbacks import ModelCheckpoint

        return [cb for cb in self.callbacks if isinstance(cb, ModelCheckpoint)]

    @property
    def checkpoint_callback(self):
        """The first ModelCheckpoint, or None."""
        found = self.checkpoint_callbacks
        return found[0] if found else None

    @property
    def early_stopping_callbacks(self) -> list:
        from framework.callbacks import EarlyStopping

        return [cb for cb in self.callbacks if isinstance(cb, EarlyStopping)]

    @property
    def early_stopping_callback(self):
        found = self.early_stopping_callbacks
        return found[0] if found else None

    @property
    def progress_bar_callback(self):
        from framework.callbacks import RichProgressBar

        return next((cb for cb in self.callbacks if isinstance(cb, RichProgressBar)), None)

    # -- where the run stands -------------------------------------------------------------------
    @property
    def validating(self) -> bool:
        return self.state.stage == "validate"

    @property
    def testing(self) -> bool:
        return self.state.stage == "test"

    @property
    def predicting(self) -> bool:
        return self.state.stage == "predict"

    @property
    def interrupted(self) -> bool:
        return self.state.status == "interrupted"

    @property
    def ckpt_path(self) -> str | None:
        """The checkpoint the current (or last) run started from."""
        return self.state.ckpt_path

    @property
    def is_last_batch(self) -> bool:
        return self.state.is_last_batch

    @property
    def estimated_stepping_batches(self) -> float:
        """Optimizer steps the fit will take at most (``inf`` without a bound), from the
        training loader's length, the limits and accumulation: for sizing LR schedules in
        ``configure_optimizers``."""
        loaders = self.loaders.get("train") or []
        if not loaders:
            return math.inf if self.max_steps == -1 else float(self.max_steps)
        from framework.loops.batches import num_batches

        per_epoch = num_batches(loaders[0], self.limits["train"])
        steps = math.ceil(per_epoch / self.accumulate_grad_batches) * max(self.max_epochs, 1) \
            if not math.isinf(per_epoch) and self.max_epochs != -1 else math.inf
        if self.max_steps != -1:
            steps = min(steps, self.max_steps)
        return steps

    # -- devices --------------------------------------------------------------------------------
    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def device_ids(self) -> list[int]:
        return list(self.devices)

    @property
    def node_rank(self) -> int:
        return self.strategy.dist.node_rank

    # -- data -----------------------------------------------------------------------------------
    def _loaders_of(self, key: str) -> Any:
        found = self.loaders.get(key) or []
        return found[0] if len(found) == 1 else (found or None)

    @property
    def train_dataloader(self):
        return self._loaders_of("train")

    @property
    def val_dataloaders(self):
        return self._loaders_of("validate")

    @property
    def test_dataloaders(self):
        return self._loaders_of("test")

    @property
    def predict_dataloaders(self):
        return self._loaders_of("predict")
