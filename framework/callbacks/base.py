"""The callback base: every hook does nothing, so a callback overrides only what it needs.

The Trainer calls hooks through ``framework.loops.hooks.HookDispatcher``, which skips callbacks that
do not override a hook; an empty hook therefore costs nothing per step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from framework.module import TrainModule
    from framework.trainer import Trainer


class Callback:
    """Base class for callbacks. Hooks receive the Trainer and the TrainModule.

    A callback stops training by setting ``trainer.should_stop = True``, never by raising.
    State returned by ``state_dict`` is saved in checkpoints under ``state_key`` and handed back
    to ``load_state_dict`` on resume.
    """

    @property
    def state_key(self) -> str:
        """The key of this callback's ``state_dict`` in a checkpoint: its class's qualified name."""
        return type(self).__qualname__

    # setup / teardown
    def setup(self, trainer: Trainer, module: TrainModule, stage: str) -> None:
        """At the start of each call (``stage``: fit, validate, test or predict), before the module's ``setup``."""

    def teardown(self, trainer: Trainer, module: TrainModule, stage: str) -> None:
        """At the end of each call, before the module's ``teardown``; not after a failure."""

    # fit
    def on_fit_start(self, trainer: Trainer, module: TrainModule) -> None:
        """At the start of fit, once set-up is done and a checkpoint restored, before the sanity check."""

    def on_fit_end(self, trainer: Trainer, module: TrainModule) -> None:
        """At the end of fit, after ``on_train_end``."""

    def on_sanity_check_start(self, trainer: Trainer, module: TrainModule) -> None:
        """Before the sanity check: the validation batches a fit runs before training."""

    def on_sanity_check_end(self, trainer: Trainer, module: TrainModule) -> None:
        """After the sanity check, before ``on_train_start``."""

    def on_train_start(self, trainer: Trainer, module: TrainModule) -> None:
        """Before the first training epoch, after the sanity check."""

    def on_train_end(self, trainer: Trainer, module: TrainModule) -> None:
        """After the last training epoch."""

    def on_train_epoch_start(self, trainer: Trainer, module: TrainModule) -> None:
        """At the start of each training epoch."""

    def on_train_epoch_end(self, trainer: Trainer, module: TrainModule) -> None:
        """After each training epoch and its validation; ``trainer.callback_metrics`` holds the epoch's values."""

    def on_train_batch_start(self, trainer: Trainer, module: TrainModule, batch: Any, batch_idx: int) -> None:
        """Before each training batch's ``training_step``."""

    def on_train_batch_end(self, trainer: Trainer, module: TrainModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        """After each training batch (and its optimizer step); ``outputs``: what ``training_step`` returned."""

    def on_before_backward(self, trainer: Trainer, module: TrainModule, loss: torch.Tensor) -> None:
        """Before the backward of each training loss."""

    def on_after_backward(self, trainer: Trainer, module: TrainModule) -> None:
        """After each backward, before the optimizer step: the gradients are there (scaled under 16-mixed)."""

    def on_before_optimizer_step(self, trainer: Trainer, module: TrainModule,
                                 optimizer: torch.optim.Optimizer) -> None:
        """Before each optimizer step, with the gradients unscaled and not yet clipped."""

    def on_before_zero_grad(self, trainer: Trainer, module: TrainModule, optimizer: torch.optim.Optimizer) -> None:
        """Before the gradients are zeroed, at the start of each accumulation window."""

    # evaluation (validation runs inside fit too)
    def on_validation_start(self, trainer: Trainer, module: TrainModule) -> None:
        """At the start of each validation (in fit, the sanity check's too; in ``trainer.validate``)."""

    def on_validation_end(self, trainer: Trainer, module: TrainModule) -> None:
        """At the end of each validation, after ``on_validation_epoch_end``."""

    def on_validation_epoch_start(self, trainer: Trainer, module: TrainModule) -> None:
        """Before the first validation batch, after ``on_validation_start``."""

    def on_validation_epoch_end(self, trainer: Trainer, module: TrainModule) -> None:
        """After the last validation batch; ``trainer.callback_metrics`` holds the epoch's values."""

    def on_validation_batch_start(self, trainer: Trainer, module: TrainModule, batch: Any,
                                  batch_idx: int, dataloader_idx: int = 0) -> None:
        """Before each validation batch's ``validation_step``."""

    def on_validation_batch_end(self, trainer: Trainer, module: TrainModule, outputs: Any,
                                batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """After each validation batch; ``outputs``: what ``validation_step`` returned."""

    def on_test_start(self, trainer: Trainer, module: TrainModule) -> None:
        """At the start of ``trainer.test``, before ``on_test_epoch_start``."""

    def on_test_end(self, trainer: Trainer, module: TrainModule) -> None:
        """At the end of ``trainer.test``, after ``on_test_epoch_end``."""

    def on_test_epoch_start(self, trainer: Trainer, module: TrainModule) -> None:
        """Before the first test batch, after ``on_test_start``."""

    def on_test_epoch_end(self, trainer: Trainer, module: TrainModule) -> None:
        """After the last test batch; ``trainer.callback_metrics`` holds the epoch's values."""

    def on_test_batch_start(self, trainer: Trainer, module: TrainModule, batch: Any, batch_idx: int,
                            dataloader_idx: int = 0) -> None:
        """Before each test batch's ``test_step``."""

    def on_test_batch_end(self, trainer: Trainer, module: TrainModule, outputs: Any,
                          batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """After each test batch; ``outputs``: what ``test_step`` returned."""

    def on_predict_start(self, trainer: Trainer, module: TrainModule) -> None:
        """At the start of ``trainer.predict``, before ``on_predict_epoch_start``."""

    def on_predict_end(self, trainer: Trainer, module: TrainModule) -> None:
        """At the end of ``trainer.predict``, after ``on_predict_epoch_end``."""

    def on_predict_epoch_start(self, trainer: Trainer, module: TrainModule) -> None:
        """Before the first prediction batch, after ``on_predict_start``."""

    def on_predict_epoch_end(self, trainer: Trainer, module: TrainModule) -> None:
        """After the last prediction batch."""

    def on_predict_batch_start(self, trainer: Trainer, module: TrainModule, batch: Any, batch_idx: int,
                               dataloader_idx: int = 0) -> None:
        """Before each prediction batch's ``predict_step``."""

    def on_predict_batch_end(self, trainer: Trainer, module: TrainModule, outputs: Any,
                             batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """After each prediction batch; ``outputs``: what ``predict_step`` returned."""

    # errors and checkpoints
    def on_exception(self, trainer: Trainer, module: TrainModule, exception: BaseException) -> None:
        """A call failed with ``exception``, before it goes on to the caller (``teardown`` is not called then)."""

    def on_save_checkpoint(self, trainer: Trainer, module: TrainModule, checkpoint: dict[str, Any]) -> None:
        """When a checkpoint is written, before the module's hook: add what you need to ``checkpoint``."""

    def on_load_checkpoint(self, trainer: Trainer, module: TrainModule, checkpoint: dict[str, Any]) -> None:
        """When a checkpoint is restored, before this callback's ``load_state_dict``."""

    def state_dict(self) -> dict:
        """What to save in every checkpoint (under ``state_key``); ``load_state_dict`` gets it back on resume."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """On resume: the state this callback's ``state_dict`` saved in the checkpoint."""

