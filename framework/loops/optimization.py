"""The per-batch training path, in three pieces built once per epoch:

1. ``forward_backward``: ``training_step`` under autocast, the loss divided for gradient
   accumulation, backward (scaled under ``16-mixed``); on accumulation steps inside ``no_sync``,
   so DDP all-reduces the gradients only on the batch that steps.
2. ``optimizer_step``: for each optimizer, unscale (so hooks and clipping see true gradients),
   ``on_before_optimizer_step``, clip by norm or value, step (through the GradScaler), zero.
3. ``step_schedulers``: LR schedulers of the ``step`` interval after each optimizer step, of the
   ``epoch`` interval after each epoch, every ``frequency``; ReduceLROnPlateau reads its metric.

Each piece is a closure over what it needs, looked up once per epoch, so the per-batch path
does no attribute lookups, allocates no hook lists and calls no hook nobody overrides.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Callable

import torch

from framework.errors import ConfigError, TrainingError
from framework.loops.batches import positional_arity
from framework.rank_zero import rank_zero_warn

_NO_CONTEXT = contextlib.nullcontext()


def forward_backward_fn(trainer) -> Callable[[Any, int, bool], Any]:
    """``(batch, batch_idx, sync) -> outputs``; ``sync=False`` skips DDP's gradient all-reduce.

    A non-finite loss is caught here, before its backward (``trainer.on_nonfinite``): ``error``
    stops the run naming the step, ``skip`` drops the batch on every rank (no backward, no
    step), ``warn`` says so and goes on.
    """
    strategy, precision, hooks = trainer.strategy, trainer.precision, trainer.hooks
    guard = nonfinite_guard(trainer)
    step = strategy.training_step_fn(trainer.module)
    with_idx = positional_arity(trainer.module.training_step) >= 2  # training_step(self, batch) is allowed
    accumulate = trainer.accumulate_grad_batches
    no_sync = strategy.no_sync if strategy.multi_process and accumulate > 1 else None
    autocast = precision.autocast if precision.autocast_dtype is not None else None
    backward = precision.backward if precision.scaler is not None else torch.Tensor.backward
    before_backward = hooks.per_batch("on_before_backward")
    after_backward = hooks.per_batch("on_after_backward")

    def forward_backward(batch: Any, batch_idx: int, sync: bool) -> Any:
        with no_sync() if no_sync is not None and not sync else _NO_CONTEXT:
            with autocast() if autocast is not None else _NO_CONTEXT:
                outputs = step(batch, batch_idx) if with_idx else step(batch)
            loss = _loss_of(outputs) if isinstance(outputs, dict) else outputs
            if loss is not None:
                loss = guard(loss, batch_idx)
            if loss is not None:  # None: the step chose to skip this batch (or the guard did)
                if accumulate > 1:
                    loss = loss / accumulate
                if before_backward is not None:
                    before_backward(loss)
                backward(loss)
                if after_backward is not None:
                    after_backward()
        return outputs

    forward_backward.flush_checks = guard.flush  # the epoch's end reads what is still pending
    return forward_backward


def _loss_of(outputs: dict) -> Any:
    if "loss" not in outputs:
        raise TrainingError(
            f"training_step returned a dict without 'loss' (keys: {', '.join(map(str, outputs)) or 'none'}); "
            "put the loss to optimise under 'loss', or return None to skip the batch"
        )
    return outputs["loss"]


#: on an accelerator, losses are checked together every so many steps: reading one is a sync
CHECK_EVERY_ON_ACCELERATORS = 50


def checks_later(device: torch.device) -> bool:
    """Read losses in batches (no host sync per step) on this device? Not on the CPU, where a
    scalar's ``.item()`` costs ~0.2 µs."""
    return device.type != "cpu"


def nonfinite_guard(trainer) -> Callable[[torch.Tensor, int], torch.Tensor | None]:
    """What to do with each loss: return it, return None (skip the batch), or raise.

    ``skip`` must decide before the backward, so it reads every loss at once. ``error`` and
    ``warn`` on an accelerator keep a finite-flag per step on the device and read them together
    every ``CHECK_EVERY_ON_ACCELERATORS`` steps and at each epoch end (``guard.flush``), naming
    the first bad step: the run may go on a few steps past it, and the weights check before
    every checkpoint write keeps a bad state off the disk meanwhile.
    """
    mode, state, strategy = trainer.on_nonfinite, trainer.state, trainer.strategy
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


def optimizer_step_fn(trainer) -> Callable[[], None]:
    """``() -> None``: step and zero every optimizer."""
    precision, optimizers = trainer.precision, trainer.optimizers
    before_step = trainer.hooks.per_batch("on_before_optimizer_step")
    clip_val, clip_algorithm = trainer.gradient_clip_val, trainer.gradient_clip_algorithm
    plain = precision.scaler is None and not clip_val

    state = trainer.state

    def optimizer_step() -> None:
        if state.skip_step:  # a non-finite loss in this accumulation group (on_nonfinite=skip)
            state.skip_step = False
            for opt in optimizers:
                opt.zero_grad(set_to_none=True)
            return
        for opt in optimizers:
            if not plain:
                precision.unscale(opt)  # hooks and clipping see the true gradients
            if before_step is not None:
                before_step(opt)
            if plain:
                opt.step()
            else:
                if clip_val:
                    clip_gradients(opt, clip_val, clip_algorithm)
                precision.step(opt)
            opt.zero_grad(set_to_none=True)

    return optimizer_step


def clip_gradients(optimizer: torch.optim.Optimizer, value: float, algorithm: str) -> None:
    params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    if algorithm == "norm":
        torch.nn.utils.clip_grad_norm_(params, value)
    else:
        torch.nn.utils.clip_grad_value_(params, value)


def step_schedulers(trainer, interval: str) -> None:
    """Step the schedulers of ``interval`` (``step`` or ``epoch``) that are due."""
    count = trainer.global_step if interval == "step" else trainer.current_epoch + 1
    for cfg in trainer.lr_scheduler_configs:
        if cfg.interval != interval or count % cfg.frequency:
            continue
        if isinstance(cfg.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            monitor = cfg.monitor or "val_loss"
            metrics = trainer.callback_metrics
            if monitor not in metrics:
                if cfg.strict:
                    raise ConfigError(
                        f"lr_scheduler monitor '{monitor}' was not logged; logged: {', '.join(sorted(metrics)) or 'none'}"
                    )
                continue
            cfg.scheduler.step(float(metrics[monitor]))
        else:
            cfg.scheduler.step()
