"""One batch of automatic optimization, with Lightning's hooks in Lightning's places.

Per batch (``train_batch``), built once per epoch by ``automatic_step_fn``:

1. On a batch that only accumulates (``accumulate_grad_batches = k``: k-1 of every k), the
   *closure* runs inside DDP's ``no_sync``: no optimizer step, no gradient all-reduce.
2. On a batch that steps, ``module.optimizer_step(epoch, batch_idx, optimizer, closure)`` runs,
   whose default is ``optimizer.step(closure=closure)``. ``optimizer`` is the module's
   ``self.optimizers()`` wrapper: its ``step`` runs the closure, then ``on_before_optimizer_step``
   (gradients unscaled under ``16-mixed``), then ``configure_gradient_clipping`` (the Trainer's
   ``gradient_clip_val``), then the optimizer's own step (through the GradScaler).

The closure (``closure.py``): ``training_step`` under autocast, the loss checked
(``trainer.on_nonfinite``) and divided by k; on the first batch of each window
``on_before_zero_grad`` and ``optimizer_zero_grad``; then ``on_before_backward``,
``module.backward`` (scaled under ``16-mixed``), ``on_after_backward``. A hook nobody overrides
is not called; a default that does the obvious thing is done inline. Where nothing at all runs
between the parts (no such hook, no clipping, no scaler, no accumulation, no profiler: the
common case), one function does the closure's and the step's work in their order
(``_plain_batch_fn``): the same calls on the same tensors, without six Python calls a batch.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from framework.errors import ConfigError
from framework.loops.closure import closure_fn, hook_action, loss_of, training_step_and_backward
from framework.loops.nonfinite import NonfiniteGuard, nonfinite_guard
from framework.waits import waiting_in

if TYPE_CHECKING:
    from framework.trainer.run import Run

_NO_CONTEXT = contextlib.nullcontext()


def check_one_optimizer(optimizers: list[torch.optim.Optimizer]) -> None:
    """Automatic optimization steps one optimizer, as in Lightning."""
    if not optimizers:
        raise ConfigError("configure_optimizers() returned no optimizer; return one (e.g. torch.optim.Adam("
                          "self.parameters())), or train in manual optimization")
    if len(optimizers) > 1:
        raise ConfigError(
            f"configure_optimizers() returned {len(optimizers)} optimizers: training with several "
            "optimizers needs manual optimization, as in Lightning; set self.automatic_optimization = False "
            "and step them in training_step (opt_a, opt_b = self.optimizers())"
        )


def automatic_step_fn(run: Run) -> tuple[Callable[[Any, int, bool], Any], Callable[[], None]]:
    """``(batch, batch_idx, steps_now) -> outputs`` of ``training_step``, and what the epoch's
    end calls to read the loss checks still pending (``nonfinite.py``)."""
    module, state, hooks, strategy = run.module, run.state, run.hooks, run.strategy
    optimizer = run.optimizers[0]
    wrapped = module.optimizers()  # what optimizer_step gets: Lightning's LightningOptimizer
    # Nobody to see when the gradients are zeroed: zero them right after the step, as a
    # hand-written loop does (the same numbers; the old gradients are freed before the next
    # forward, not after it: measurably faster on the CPU). Else at each window's start (and in
    # each call of LBFGS's closure, which it calls several times a step: each sees its own gradients).
    user_step = hooks.module_fn("optimizer_step") if hooks.module_overrides("optimizer_step") else None
    zero_after_step = user_step is None and not hooks.module_overrides("optimizer_zero_grad") \
        and hooks.per_batch("on_before_zero_grad") is None and not _reevaluates(optimizer)
    if zero_after_step:
        optimizer.zero_grad()  # gradients left from before this epoch (a backward outside fit) do not count
    guard = nonfinite_guard(run)
    closure_for = closure_fn(run, optimizer, guard, zero_in_closure=not zero_after_step)
    step = _step_fn(run, optimizer, zero_after_step)
    wrapped.use_automatic_step(step)
    accumulate = run.settings.accumulate_grad_batches
    if zero_after_step and accumulate == 1 and _nothing_between(run):
        return _plain_batch_fn(run, optimizer, guard), guard.flush
    default_step = hooks.timed(hook_action(module, "optimizer_step"), step)  # what Lightning's default does
    no_sync = strategy.no_sync if strategy.multi_process and accumulate > 1 else None

    def train_batch(batch: Any, batch_idx: int, steps_now: bool) -> Any:
        closure = closure_for(batch, batch_idx)
        if not steps_now:
            with no_sync() if no_sync is not None else _NO_CONTEXT:
                closure()
        elif user_step is None:
            default_step(closure)
        else:
            user_step(state.epoch, batch_idx, wrapped, closure)
            if not closure.ran:
                raise ConfigError(
                    f"{type(module).__name__}.optimizer_step did not call optimizer_closure, which runs "
                    "training_step, zero_grad and backward: call optimizer.step(closure=optimizer_closure) "
                    "(or optimizer_closure()) in it"
                )
        return closure.outputs

    return train_batch, guard.flush


def _nothing_between(run: Run) -> bool:
    """Does nothing run between training_step, the backward and the optimizer's step: no hook
    around them, no clipping, no autocast or gradient scaler, no profiler, no step context? Then
    a batch that zeroes after its step (never one of an optimizer that ``_reevaluates``) needs no
    closure (``_plain_batch_fn``)."""
    hooks, precision = run.hooks, run.precision
    return (hooks.profiler is None and precision.scaler is None and not precision.has_forward_context
            and all(hooks.per_batch(name) is None for name in _AROUND_THE_STEP)
            and not any(hooks.module_overrides(name) for name in _CLIPPING) and not run.settings.gradient_clip_val
            and run.strategy.step_context() is None)


_AROUND_THE_STEP = ("on_before_backward", "on_after_backward", "on_before_optimizer_step")
_CLIPPING = ("configure_gradient_clipping", "clip_gradients")  # overriding either clips the module's own way


def _reevaluates(optimizer: torch.optim.Optimizer) -> bool:
    """Does this optimizer's step call the closure again (LBFGS)? Then it gets the closure, and
    each call zeroes the gradients before its backward, as in Lightning."""
    return isinstance(optimizer, torch.optim.LBFGS)


def _plain_batch_fn(run: Run, optimizer: torch.optim.Optimizer, guard: NonfiniteGuard
                    ) -> Callable[[Any, int, bool], Any]:
    """``train_batch`` where nothing runs between the closure and the step (``_nothing_between``)
    and every batch steps: the closure's and the step's work in one call, in their order
    (training_step, the loss check, the backward, the optimizer's step, zero_grad), the same
    numbers with six Python calls fewer a batch (7-10 µs of a CPU step here: "The batch without a closure" in
    benchmarks/reports/2026-12-05-fit-overhead.md)."""
    state = run.state
    step, with_idx, backward = training_step_and_backward(run)
    marks = run.strategy.is_distributed  # where a rank waits (waits.py)
    in_step = waiting_in("training_step", user_code=True)
    in_backward = waiting_in("the backward pass's gradient sync")
    optimizer_step, zero_grad = optimizer.step, optimizer.zero_grad

    def train_batch(batch: Any, batch_idx: int, steps_now: bool) -> Any:
        if not marks:
            outputs = step(batch, batch_idx) if with_idx else step(batch)
        else:
            with in_step:
                outputs = step(batch, batch_idx) if with_idx else step(batch)
        loss = loss_of(outputs) if isinstance(outputs, dict) else outputs
        if loss is not None and guard(loss, batch_idx) is not None:
            if not marks:
                backward(loss)
            else:
                with in_backward:
                    backward(loss)
        if state.skip_step:  # a non-finite loss (on_nonfinite=skip): no step
            state.skip_step = False
            zero_grad(set_to_none=True)
            return outputs
        optimizer_step()
        zero_grad()
        return outputs

    return train_batch


def _step_fn(run: Run, optimizer: torch.optim.Optimizer, zero_after_step: bool) -> Callable[..., Any]:
    """What the wrapper's ``step(closure)`` does in automatic optimization: the closure, the
    hooks and clipping after it, and the optimizer's step."""
    module, state, hooks, precision = run.module, run.state, run.hooks, run.precision
    scaler = precision.scaler
    before_step = hooks.per_batch("on_before_optimizer_step")
    custom_clip = any(hooks.module_overrides(name) for name in _CLIPPING)
    clip_hook = hooks.module_fn("configure_gradient_clipping")
    default_clip = hooks.timed(hook_action(module, "configure_gradient_clipping"), clip_gradients)
    zero_grad = hooks.timed(hook_action(module, "optimizer_zero_grad"), optimizer.zero_grad)
    clip_val, clip_algorithm = run.settings.gradient_clip_val, run.settings.gradient_clip_algorithm
    reevaluates = _reevaluates(optimizer)
    between = before_step is not None or custom_clip or bool(clip_val)  # anything between closure and step
    optimizer_step = optimizer.step if scaler is None else functools.partial(precision.step, optimizer)

    def after_closure() -> None:
        if before_step is not None:
            before_step(optimizer)
        if custom_clip:
            clip_hook(optimizer, gradient_clip_val=clip_val, gradient_clip_algorithm=clip_algorithm)
        elif clip_val:
            default_clip(optimizer, float(clip_val), clip_algorithm or "norm")

    def step(closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:
        loss = closure() if closure is not None else None
        if state.skip_step:  # a non-finite loss in this accumulation window (on_nonfinite=skip)
            state.skip_step = False
            optimizer.zero_grad(set_to_none=True)
            return loss
        if scaler is not None and loss is not None:
            precision.unscale(optimizer)  # hooks and clipping see the true gradients
        if between:
            after_closure()
        if reevaluates and closure is not None and scaler is None:
            first = [True]

            def again() -> Any:
                if first[0]:
                    first[0] = False
                    return loss
                out = closure()
                after_closure()
                return out

            result: Any = optimizer.step(closure=again, **kwargs)
        else:
            result = loss
            if scaler is None or loss is not None:  # 16-mixed without a backward: nothing to step (Lightning)
                optimizer_step(**kwargs)
        if zero_after_step:
            zero_grad()
        return result

    return step


def clip_gradients(optimizer: torch.optim.Optimizer, value: float, algorithm: str) -> None:
    if value <= 0:
        return
    params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    if algorithm == "norm":
        torch.nn.utils.clip_grad_norm_(params, value)
    else:
        torch.nn.utils.clip_grad_value_(params, value)
