"""``ModuleHooks``: every hook of a ``TrainModule`` that the Trainer calls, with Lightning's
names, arguments and defaults; override what you need.

The loops call an override where Lightning calls it (``tests/lightning/test_hook_calls.py`` proves
the order against Lightning's); a hook nobody overrides costs nothing per step (the loops do its default inline).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from framework.errors import ConfigError

if TYPE_CHECKING:
    from framework.callbacks.base import Callback
    from framework.module.manual_optimization import TrainOptimizer
    from framework.trainer import Trainer


class ModuleHooks(nn.Module):
    """The hooks of ``framework.TrainModule`` (a base of it, not used alone)."""

    trainer: Trainer  # TrainModule's property: the Trainer it is attached to

    # -- optimization (manual optimization: manual_optimization.py) ---------------------------
    def clip_gradients(self, optimizer: torch.optim.Optimizer | TrainOptimizer, gradient_clip_val: float | None = None,
                       gradient_clip_algorithm: str | None = None) -> None:
        """Clip ``optimizer``'s gradients by norm (default) or value, as Lightning does: a value
        left None is the Trainer's (``gradient_clip_val``, ``gradient_clip_algorithm``), and one
        that contradicts the Trainer's is an error. In manual optimization the gradients are
        averaged over the ranks and unscaled first, so the clip sees the gradients the step will
        use."""
        from framework.optim import clip_gradients

        trainer = self.trainer
        manual = trainer.run.manual if trainer.run is not None else None
        if manual is None:  # automatic optimization: the Trainer's settings are the defaults
            gradient_clip_val, gradient_clip_algorithm = _clip_settings(trainer, gradient_clip_val,
                                                                        gradient_clip_algorithm)
        if not gradient_clip_val:
            return
        algorithm = (gradient_clip_algorithm or "norm").lower()
        if algorithm not in ("norm", "value"):
            raise ValueError(f"gradient_clip_algorithm '{algorithm}': use 'norm' or 'value'")
        raw = unwrapped(optimizer)
        if manual is not None:
            manual.prepare_gradients(raw)
        clip_gradients(raw, float(gradient_clip_val), algorithm)

    def configure_gradient_clipping(self, optimizer: torch.optim.Optimizer, gradient_clip_val: float | None = None,
                                    gradient_clip_algorithm: str | None = None) -> None:
        """Called before each optimizer step (after ``on_before_optimizer_step``) with the
        Trainer's clip settings; the default clips with ``self.clip_gradients``."""
        self.clip_gradients(optimizer, gradient_clip_val=gradient_clip_val,
                            gradient_clip_algorithm=gradient_clip_algorithm)

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: torch.optim.Optimizer | TrainOptimizer,
                       optimizer_closure: Callable[[], Any] | None = None) -> None:
        """Step ``optimizer`` (override to change how, e.g. a learning-rate warm-up). The closure
        runs ``training_step``, ``zero_grad`` and ``backward``: call it, through
        ``optimizer.step(closure=optimizer_closure)`` or directly. Not called on the batches
        that only accumulate gradients."""
        optimizer.step(closure=optimizer_closure)

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: torch.optim.Optimizer) -> None:
        """Zero the gradients: before the backward of the first batch of each accumulation
        window, as Lightning does."""
        optimizer.zero_grad()

    def lr_scheduler_step(self, scheduler: Any, metric: Any) -> None:
        """Step a scheduler when its interval and frequency say so; ``metric`` is the monitored
        value for ``ReduceLROnPlateau`` (else None)."""
        if metric is None:
            scheduler.step()
        else:
            scheduler.step(metric)

    # -- data and set-up hooks (Lightning's; a DataModule's come first) -----------------------
    def prepare_data(self) -> None:
        """Download or write files: once per node (local rank 0), before ``setup``."""

    def setup(self, stage: str) -> None:
        """Build what the run needs on every rank (``stage``: fit, validate, test, predict);
        runs before the module's own ``*_dataloader()`` methods are asked for data."""

    def teardown(self, stage: str) -> None:
        """At the end of each call (``stage``: fit, validate, test or predict); not after a failure."""

    def configure_model(self) -> None:
        """Build layers here instead of in ``__init__`` to create them where the run puts them
        (called once per run, after ``setup``, before ``configure_optimizers``; make it idempotent)."""

    def configure_callbacks(self) -> Sequence[Callback] | Callback:
        """Callbacks this module always wants (a list or one); they replace a Trainer callback
        of the same type, as in Lightning."""
        return []

    # -- hooks (override what you need; empty ones cost nothing per step) -------------------
    def on_fit_start(self) -> None:
        """At the start of fit, once set-up is done and a checkpoint restored, before the sanity check."""

    def on_fit_end(self) -> None:
        """At the end of fit, after ``on_train_end``."""

    def on_train_start(self) -> None:
        """Before the first training epoch, after the sanity check."""

    def on_train_end(self) -> None:
        """After the last training epoch."""

    def on_train_epoch_start(self) -> None:
        """At the start of each training epoch."""

    def on_train_epoch_end(self) -> None:
        """After each training epoch and its validation; ``trainer.callback_metrics`` holds the epoch's values."""

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        """Before each training batch's ``training_step``; return -1 to skip the rest of the epoch."""

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        """After each training batch (and its optimizer step); ``outputs``: what ``training_step`` returned."""

    def on_validation_epoch_start(self) -> None:
        """Before the first validation batch, after ``on_validation_start``."""

    def on_validation_epoch_end(self) -> None:
        """After the last validation batch; ``trainer.callback_metrics`` holds the epoch's values."""

    def on_test_epoch_start(self) -> None:
        """Before the first test batch, after ``on_test_start``."""

    def on_test_epoch_end(self) -> None:
        """After the last test batch; ``trainer.callback_metrics`` holds the epoch's values."""

    def on_predict_epoch_start(self) -> None:
        """Before the first prediction batch, after ``on_predict_start``."""

    def on_predict_epoch_end(self) -> None:
        """After the last prediction batch."""

    def on_validation_start(self) -> None:
        """At the start of each validation (in fit, the sanity check's too; in ``trainer.validate``)."""

    def on_validation_end(self) -> None:
        """At the end of each validation, after ``on_validation_epoch_end``."""

    def on_test_start(self) -> None:
        """At the start of ``trainer.test``, in eval mode, before ``on_test_epoch_start``."""

    def on_test_end(self) -> None:
        """At the end of ``trainer.test``, after ``on_test_epoch_end``."""

    def on_predict_start(self) -> None:
        """At the start of ``trainer.predict``, in eval mode, before ``on_predict_epoch_start``."""

    def on_predict_end(self) -> None:
        """At the end of ``trainer.predict``, after ``on_predict_epoch_end``."""

    def on_validation_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Before each validation batch's ``validation_step``."""

    def on_validation_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """After each validation batch; ``outputs``: what ``validation_step`` returned."""

    def on_test_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Before each test batch's ``test_step``."""

    def on_test_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """After each test batch; ``outputs``: what ``test_step`` returned."""

    def on_predict_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Before each prediction batch's ``predict_step``."""

    def on_predict_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """After each prediction batch; ``outputs``: what ``predict_step`` returned."""

    def on_before_zero_grad(self, optimizer: torch.optim.Optimizer) -> None:
        """Before the gradients are zeroed, at the start of each accumulation window."""

    def on_before_backward(self, loss: torch.Tensor) -> None:
        """Before the backward of each training loss (``loss`` as the backward gets it)."""

    def on_after_backward(self) -> None:
        """After each backward, before the optimizer step: the gradients are there (scaled under 16-mixed)."""

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Before each optimizer step, with the gradients unscaled and not yet clipped."""

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """When a checkpoint is written, after the callbacks': add what you need to ``checkpoint``."""

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """When a checkpoint is read, before the weights load: read back what ``on_save_checkpoint`` added."""

    # -- evaluation modes and batch transfer (Lightning's defaults) ---------------------------
    def on_validation_model_zero_grad(self) -> None:
        """Before validation inside fit: free the gradients (``zero_grad``)."""
        self.zero_grad()

    def _wrapped_model(self) -> nn.Module:
        model = self.trainer.model
        assert model is not None, "the model hooks run during a call, while the strategy holds the model"
        return model

    def on_validation_model_eval(self) -> None:
        """Before each validation: the model in eval mode (the default)."""
        self._wrapped_model().eval()

    def on_validation_model_train(self) -> None:
        """After validation: the default puts back each submodule's own mode from before."""
        self._wrapped_model().train()

    def on_test_model_eval(self) -> None:
        """Before testing: the model in eval mode (the default)."""
        self._wrapped_model().eval()

    def on_test_model_train(self) -> None:
        """After testing: the default puts back each submodule's own mode from before."""
        self._wrapped_model().train()

    def on_predict_model_eval(self) -> None:
        """Before predicting: the model in eval mode (the default)."""
        self._wrapped_model().eval()

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Change a batch before it moves to the device (on the CPU)."""
        return batch

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        """Move a batch to ``device``: tensors in lists, tuples, dicts and dataclasses, and
        anything with ``.to``."""
        from framework.accelerators.base import move_to_device

        return move_to_device(batch, device)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Change a batch after it moved to the device (e.g. augment it on the GPU)."""
        return batch


def unwrapped(optimizer: Any) -> torch.optim.Optimizer:
    """The optimizer itself, also when given the wrapper ``self.optimizers()`` returns (its
    ``.optimizer``)."""
    return getattr(optimizer, "optimizer", optimizer)


def _clip_settings(trainer: Trainer, value: float | None, algorithm: str | None) -> tuple[float | None, str | None]:
    """Lightning's rule: an argument left None is the Trainer's; one that contradicts it is an error."""
    if value is None:
        value = trainer.gradient_clip_val or 0.0
    elif trainer.gradient_clip_val is not None and trainer.gradient_clip_val != value:
        raise ConfigError(f"clip_gradients(gradient_clip_val={value}) contradicts trainer.gradient_clip_val="
                          f"{trainer.gradient_clip_val}; set one of them")
    trainer_algorithm = trainer.gradient_clip_algorithm
    if algorithm is None:
        algorithm = trainer_algorithm or "norm"
    elif trainer_algorithm is not None and trainer_algorithm != algorithm.lower():
        raise ConfigError(f"clip_gradients(gradient_clip_algorithm='{algorithm}') contradicts "
                          f"trainer.gradient_clip_algorithm='{trainer_algorithm}'; set one of them")
    return value, algorithm
