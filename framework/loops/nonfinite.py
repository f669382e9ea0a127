"""Non-finite losses (``trainer.on_nonfinite``): stop naming the step, skip it on every rank,
or warn, before the loss's backward."""

from __future__ import annotations

import math
from collections.abc import Callable
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


def nonfinite_guard(run: Run) -> Callable[[torch.Tensor, int], torch.Tensor | None]:
    """What to do with each loss: return it, return None (skip the batch), or raise.

    ``skip`` must decide before the backward, so it reads every loss at once. ``error`` and
    ``warn`` on an accelerator keep a finite-flag per step on the device and read them together
    every ``CHECK_EVERY_ON_ACCELERATORS`` steps and at each epoch end (``guard.flush``), naming
    the first bad step: the run may go on a few steps past it, and the weights check before
    every checkpoint write keeps a bad state off the disk meanwhile.
    """
    mode, state, strategy = run.settings.on_nonfinite, run.state, run.strategy
    agree = strategy.is_distributed and mode == "skip"  # every rank must skip the same batch
    # DDP expects a backward after each forward: there the batch runs backward and the step
    # then throws its gradients away (``state.skip_step``); alone, the batch just stops here
    backward_anyway = strategy.multi_process
    pending: list[tuple[str, torch.Tensor, torch.Tensor]] = []  # (where, finite flag, loss)

    def report(where: str, loss: torch.Tensor) -> None:
        value = loss.detach().float().reshape(-1)[0].item()
        if mode == "error":
            raise TrainingError(
                f"the loss is {value} at {where}; the run stops here and checkpoints already written "
                "stay as they are. Lower the learning rate, clip gradients (trainer.gradient_clip_val), "
                "or set trainer.on_nonfinite=skip to drop such batches"
            )
        rank_zero_warn(f"non-finite loss at {where}: " + ("step skipped" if mode == "skip" else "training on")
                       + "; lower the learning rate or clip gradients (trainer.gradient_clip_val)")

    def flush() -> None:
        checked = list(pending)
        pending.clear()
        if not checked or bool(torch.stack([flag for _, flag, _ in checked]).all()):  # one sync for all
            return
        where, _, loss = next(item for item in checked if not bool(item[1]))  # the first bad step
        report(where, loss)

    def guard(loss: torch.Tensor, batch_idx: int) -> torch.Tensor | None:
        where = f"step {state.global_step + 1} (epoch {state.epoch}, batch {batch_idx})"
        if mode != "skip" and checks_later(loss.device):
            pending.append((where, torch.isfinite(loss.detach()).all(), loss.detach()))
            if len(pending) >= CHECK_EVERY_ON_ACCELERATORS:
                flush()
            return loss
        # a scalar's .item() costs ~0.2 µs on the CPU; torch.isfinite(...).all() ~7 µs
        finite = math.isfinite(loss.item()) if loss.numel() == 1 else bool(torch.isfinite(loss.detach()).all())
        if agree:
            finite = strategy.reduce_boolean_decision(finite, all=True)
        if finite:
            return loss
        report(where, loss)
        if mode == "warn":
            return loss
        state.skip_step = True
        return loss if backward_anyway else None

    guard.flush = flush
    return guard
