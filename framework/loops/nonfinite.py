"""Non-finite losses (``trainer.on_nonfinite``): stop naming the step, skip it on every rank,
or warn, before the loss's backward."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from framework.errors import TrainingError
from framework.rank_zero import rank_zero_warn

if TYPE_CHECKING:
    from framework.trainer.run import Run

#: on an accelerator, losses are checked together every so many steps: reading one is a sync
CHECK_EVERY_ON_ACCELERATORS = 50


def checks_later(device: torch.device) -> bool:
    """Read losses in batches (no host sync per step) on this device? Not on the CPU, where a
    scalar's ``.item()`` costs ~0.2 µs."""
    return device.type != "cpu"


#: where a loss was seen: (its step, counted from 1; the epoch; the batch index), put in words
#: only for a bad loss (an f-string per batch would cost more than the check itself on the CPU)
_Where = tuple[int, int, int]


class NonfiniteGuard:
    """What to do with each loss (``guard(loss, batch_idx)``): return it, return None (skip the
    batch), or raise.

    ``skip`` must decide before the backward, so it reads every loss at once. ``error`` and
    ``warn`` on an accelerator keep a finite-flag per step on the device and read them together
    every ``CHECK_EVERY_ON_ACCELERATORS`` steps and at each epoch end (``flush``), naming the
    first bad step: the run may go on a few steps past it, and the weights check before every
    checkpoint write keeps a bad state off the disk meanwhile.
    """

    __slots__ = ("agree", "backward_anyway", "later", "mode", "pending", "state", "strategy")

    def __init__(self, run: Run) -> None:
        self.mode, self.state, self.strategy = run.settings.on_nonfinite, run.state, run.strategy
        self.agree = self.strategy.is_distributed and self.mode == "skip"  # every rank must skip the same batch
        # DDP expects a backward after each forward: there the batch runs backward and the step
        # then throws its gradients away (``state.skip_step``); alone, the batch just stops here
        self.backward_anyway = self.strategy.multi_process
        self.pending: list[tuple[_Where, torch.Tensor, torch.Tensor]] = []  # (where, finite flag, loss)
        self.later: bool | None = None  # checks_later for the losses' device, asked at the first loss

    def __call__(self, loss: torch.Tensor, batch_idx: int) -> torch.Tensor | None:
        mode, state, later = self.mode, self.state, self.later
        if later is None:
            later = self.later = mode != "skip" and checks_later(loss.device)
        if later:
            where = (state.global_step + 1, state.epoch, batch_idx)
            self.pending.append((where, torch.isfinite(loss.detach()).all(), loss.detach()))
            if len(self.pending) >= CHECK_EVERY_ON_ACCELERATORS:
                self.flush()
            return loss
        # a scalar's .item() costs ~0.2 µs on the CPU; torch.isfinite(...).all() ~7 µs
        finite = math.isfinite(loss.item()) if loss.numel() == 1 else bool(torch.isfinite(loss.detach()).all())
        if self.agree:
            finite = self.strategy.reduce_boolean_decision(finite, all=True)
        if finite:
            return loss
        self._report((state.global_step + 1, state.epoch, batch_idx), loss)
        if mode == "warn":
            return loss
        state.skip_step = True
        return loss if self.backward_anyway else None

    def flush(self) -> None:
        """Read the pending finite-flags (one sync for all); raise or warn for the first bad step."""
        checked = list(self.pending)
        self.pending.clear()
        if not checked or bool(torch.stack([flag for _, flag, _ in checked]).all()):  # one sync for all
            return
        where, _, loss = next(item for item in checked if not bool(item[1]))  # the first bad step
        self._report(where, loss)

    def _report(self, at: _Where, loss: torch.Tensor) -> None:
        step, epoch, batch_idx = at
        where = f"step {step} (epoch {epoch}, batch {batch_idx})"
        value = loss.detach().float().reshape(-1)[0].item()
        if self.mode == "error":
            raise TrainingError(
                f"the loss is {value} at {where}; the run stops here and checkpoints already written "
                "stay as they are. Lower the learning rate, clip gradients (trainer.gradient_clip_val), "
                "or set trainer.on_nonfinite=skip to drop such batches"
            )
        rank_zero_warn(f"non-finite loss at {where}: " + ("step skipped" if self.mode == "skip" else "training on")
                       + "; lower the learning rate or clip gradients (trainer.gradient_clip_val)")


def nonfinite_guard(run: Run) -> NonfiniteGuard:
    """The run's ``NonfiniteGuard``: called with each loss, ``flush()`` at each epoch end."""
    return NonfiniteGuard(run)
