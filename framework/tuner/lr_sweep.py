"""The learning-rate sweep behind ``Tuner.lr_find``, step for step Lightning's.

One fit of ``num_training`` optimizer steps (``Trials``: the tuner's callback only, no logger,
the weights put back after). At its start the one optimizer's rates are set to ``min_lr`` and
the module's schedulers are replaced by one that raises the rate after every step; before each
step the callback records the rate, after it the loss smoothed over the steps so far
(``beta=0.98``, bias-corrected with ``global_step + 1`` as Lightning does), and it stops the fit
once that loss is more than ``early_stop_threshold`` times the best so far. Under gradient
accumulation only the batches that step count, as in Lightning. A sweep that the training data
cuts short (``max_epochs``) gives Lightning's results and suggestion too, with a warning that
they cover only the rates it reached.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from framework.callbacks.base import Callback
from framework.errors import ConfigError
from framework.optim import LRSchedulerConfig
from framework.rank_zero import rank_zero_info, rank_zero_warn
from framework.tuner.lr_finder import LRFinder
from framework.tuner.trials import Trials

if TYPE_CHECKING:
    from framework.module import TrainModule
    from framework.trainer import Trainer


class SweepLR(torch.optim.lr_scheduler.LRScheduler):
    """From each group's ``initial_lr`` to ``end_lr`` in ``num_iter`` steps, exponentially or
    linearly. The rates are Lightning's ``_ExponentialLR`` / ``_LinearLR`` ones to the bit: the
    first step uses the start rate, step ``i > 0`` the rate at ``(i + 1) / num_iter`` of the
    way (so the sweep reaches ``end_lr`` at step ``num_iter - 1``)."""

    def __init__(self, optimizer: torch.optim.Optimizer, end_lr: float, num_iter: int, mode: str) -> None:
        self.end_lr, self.num_iter, self.mode = end_lr, num_iter, mode
        self.lr: list[float] = []
        super().__init__(optimizer)

    def get_lr(self) -> list[float]:  # type: ignore[override]  # floats, as Lightning's
        r = (self.last_epoch + 1) / self.num_iter
        bases = [float(base) for base in self.base_lrs]
        if self.last_epoch <= 0:
            values = bases
        elif self.mode == "linear":
            values = [base + r * (self.end_lr - base) for base in bases]
        else:
            values = [base * (self.end_lr / base) ** r for base in bases]
        self.lr = values
        return values


class _Recorder(Callback):
    """Lightning's ``_LRCallback``: sets the sweep up at the fit's start, records each step's rate
    and smoothed loss, and stops the fit when the loss diverges."""

    def __init__(self, finder: LRFinder, early_stop_threshold: float | None, beta: float = 0.98) -> None:
        self.finder, self.early_stop_threshold, self.beta = finder, early_stop_threshold, beta
        self.lrs: list[float] = []
        self.losses: list[float] = []
        self.avg_loss = self.best_loss = 0.0
        self.scheduler: SweepLR | None = None
        self.diverged = False
        self.steps = 0

    def on_fit_start(self, trainer: Trainer, module: TrainModule) -> None:
        run = trainer.run
        assert run is not None, "a fit is on"
        if len(run.optimizers) != 1:
            raise ConfigError(f"lr_find: configure_optimizers() returned {len(run.optimizers)} optimizers; the learning "
                              "rate finder sweeps one: return a single optimizer")
        optimizer, finder = run.optimizers[0], self.finder
        for group in optimizer.param_groups:
            group["lr"] = group["initial_lr"] = finder.lr_min
        self.scheduler = SweepLR(optimizer, finder.lr_max, finder.num_training, finder.mode)
        run.lr_scheduler_configs = [LRSchedulerConfig(self.scheduler, interval="step")]

    def _steps_now(self, trainer: Trainer, batch_idx: int) -> bool:
        return (batch_idx + 1) % trainer.accumulate_grad_batches == 0

    def on_train_batch_start(self, trainer: Trainer, module: TrainModule, batch: Any, batch_idx: int) -> None:
        if self._steps_now(trainer, batch_idx):
            assert self.scheduler is not None, "set at on_fit_start"
            self.lrs.append(self.scheduler.lr[0])

    def on_train_batch_end(self, trainer: Trainer, module: TrainModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if not self._steps_now(trainer, batch_idx):
            return
        if not outputs:  # training_step returned None: a point the suggestion leaves out
            self.losses.append(float("nan"))
            return
        loss = outputs if isinstance(outputs, torch.Tensor) else outputs["loss"]
        step = trainer.global_step
        self.avg_loss = self.beta * self.avg_loss + (1 - self.beta) * loss.item()
        smoothed = self.avg_loss / (1 - self.beta ** (step + 1))
        threshold = self.early_stop_threshold
        if threshold is not None and step > 1 and smoothed > threshold * self.best_loss:
            trainer.should_stop = self.diverged = True
        if smoothed < self.best_loss or step == 1:
            self.best_loss = smoothed
        self.losses.append(smoothed)

    def on_train_end(self, trainer: Trainer, module: TrainModule) -> None:
        self.steps = trainer.global_step


def sweep(trials: Trials, finder: LRFinder, early_stop_threshold: float | None, train: Any, val: Any) -> None:
    """Run the sweep as one trial fit; its rates and losses go into ``finder.results``."""
    recorder = _Recorder(finder, early_stop_threshold)
    # Lightning validates on as many batches as it trains during the sweep
    trials.call("fit", [recorder], train=train, val=val, max_steps=finder.num_training,
               limits={"validate": finder.num_training})
    finder.results = {"lr": recorder.lrs, "loss": recorder.losses}
    steps, asked = recorder.steps, finder.num_training
    if steps == asked:
        return
    if recorder.diverged:  # the range above is of no use: the sweep did its job
        rank_zero_info(f"fw lr_find: stopped after {steps} of {asked} steps: the loss diverged (early_stop_threshold)")
        return
    # Lightning 2.6 says so at info level alone (and calls it a diverging loss), and suggests from what ran
    reached = f"the rates swept reached {recorder.lrs[-1]:.3g}" if recorder.lrs else "no rate was tried"
    rank_zero_warn(f"lr_find: the training data ran out after {steps} of num_training={asked} steps "
                   f"(max_epochs={trials.trainer.settings.max_epochs}, limit_train_batches): {reached} of "
                   f"max_lr={finder.lr_max:g}, and a suggestion comes from that part of the range only; raise "
                   "max_epochs (or the training batches) or lower num_training to sweep all of it")
