"""One batch of automatic optimization, with Lightning's hooks in Lightning's places.

Per batch (``train_batch``), built once per epoch by ``automatic_step_fn``:

1. On a batch that only accumulates (``accumulate_grad_batches = k``: k-1 of every k), the
   *closure* runs inside DDP's ``no_sync``: no optimizer step, no gradient all-reduce.
2. On a batch that steps, ``module.optimizer_step(epoch, batch_idx, optimizer, closure)`` runs,
   whose default is ``optimizer.step(closure=closure)``. ``optimizer`` is the module's
   ``self.optimizers()`` wrapper: its ``step`` runs the closure, then ``on_before_optimizer_step``
   (gradients unscaled under ``16-mixed``), then ``configure_gradient_clipping`` (the Trainer's
   ``gradient_clip_val``), then the optimizer's own step (through the GradScaler).

The closure: ``training_step`` under autocast, the loss checked (``trainer.on_nonfinite``) and
divided by k; on the first batch of each window ``on_before_zero_grad`` and
``optimizer_zero_grad``; then ``on_before_backward``, ``module.backward`` (scaled under
``16-mixed``), ``on_after_backward``. A hook nobody overrides is not called; a default that does
the obvious thing is done inline.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from framework.counting import every
from framework.errors import ConfigError, TrainingError
from framework.loops.batches import positional_arity
from framework.loops.nonfinite import NonfiniteGuard, nonfinite_guard
from framework.strategies.base import inside
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
    # forward, not after it: measurably faster on the CPU). Else at each window's start.
    user_step = hooks.module_fn("optimizer_step") if hooks.module_overrides("optimizer_step") else None
    zero_after_step = user_step is None and not hooks.module_overrides("optimizer_zero_grad") \
        and hooks.per_batch("on_before_zero_grad") is None
    if zero_after_step:
        optimizer.zero_grad()  # gradients left from before this epoch (a backward outside fit) do not count
    guard = nonfinite_guard(run)
    closure_for = _closure_fn(run, optimizer, guard, zero_in_closure=not zero_after_step)
    step = _step_fn(run, optimizer, zero_after_step)
    wrapped.use_automatic_step(step)
    default_step = hooks.timed(_hook_action(module, "optimizer_step"), step)  # what Lightning's default does
    accumulate = run.settings.accumulate_grad_batches
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


class Closure:
    """One batch's closure, what ``optimizer.step(closure)`` calls: it returns the loss its
    backward used; ``ran`` says whether it was called, ``outputs`` what ``training_step`` returned."""

    __slots__ = ("body", "ran", "outputs")

    def __init__(self, body: Callable[[Closure], Any]) -> None:
        self.body, self.ran, self.outputs = body, False, None

    def __call__(self) -> Any:
        self.ran = True
        return self.body(self)


def _closure_fn(run: Run, optimizer: torch.optim.Optimizer, guard: NonfiniteGuard, zero_in_closure: bool
                ) -> Callable[[Any, int], Closure]:
    """``(batch, batch_idx) -> closure`` (``Closure``)."""
    module, state, hooks, strategy, precision = (run.module, run.state, run.hooks,
                                                 run.strategy, run.precision)
    step = hooks.strategy_fn("training_step", precision.converting(strategy.training_step_fn(module)))
    with_idx = positional_arity(module.training_step) >= 2  # training_step(self, batch) is allowed
    accumulate = run.settings.accumulate_grad_batches
    autocast = precision.forward_context if precision.has_forward_context else None
    scaler = precision.scaler
    backward = hooks.strategy_fn("backward", module.backward if hooks.module_overrides("backward")
                                 else torch.Tensor.backward)
    before_backward = hooks.per_batch("on_before_backward")
    after_backward = hooks.per_batch("on_after_backward")
    before_zero_grad = hooks.per_batch("on_before_zero_grad")
    zero_grad = hooks.module_fn("optimizer_zero_grad") if hooks.module_overrides("optimizer_zero_grad") else None
    default_zero_grad = hooks.timed(_hook_action(module, "optimizer_zero_grad"), optimizer.zero_grad)
    in_context = strategy.step_context() is not None  # model_parallel's loss parallel: step and backward inside
    marks = strategy.is_distributed  # where a rank waits, for the heartbeat and a collective's errors (waits.py)
    in_step = waiting_in("training_step", user_code=True) if marks else _NO_CONTEXT
    in_backward = waiting_in("the backward pass's gradient sync")
    bare = autocast is None and not marks  # one process, no autocast: the step needs no context at all

    def closure_for(batch: Any, batch_idx: int) -> Closure:
        def body(closure: Closure) -> Any:
            if bare:
                outputs = closure.outputs = step(batch, batch_idx) if with_idx else step(batch)
            else:
                with autocast() if autocast is not None else _NO_CONTEXT, in_step:
                    outputs = closure.outputs = step(batch, batch_idx) if with_idx else step(batch)
            loss = _loss_of(outputs) if isinstance(outputs, dict) else outputs
            if loss is not None:
                loss = guard(loss, batch_idx)
            if zero_in_closure and every(accumulate, batch_idx):  # the first batch of an accumulation window
                if before_zero_grad is not None:
                    before_zero_grad(optimizer)
                if zero_grad is not None:
                    zero_grad(state.epoch, batch_idx, optimizer)
                else:
                    default_zero_grad()
            if loss is None:  # the step chose to skip this batch (or the guard did)
                return None
            if accumulate > 1:
                loss = loss / accumulate
            if scaler is not None:
                loss = scaler.scale(loss)
            if before_backward is not None:
                before_backward(loss)
            if not marks:
                backward(loss)
            else:
                with in_backward:
                    backward(loss)
            if after_backward is not None:
                after_backward()
            return loss

        return Closure(inside(strategy.step_context, body) if in_context else body)

    return closure_for


def _step_fn(run: Run, optimizer: torch.optim.Optimizer, zero_after_step: bool) -> Callable[..., Any]:
    """What the wrapper's ``step(closure)`` does in automatic optimization: the closure, the
    hooks and clipping after it, and the optimizer's step."""
    module, state, hooks, precision = run.module, run.state, run.hooks, run.precision
    scaler = precision.scaler
    before_step = hooks.per_batch("on_before_optimizer_step")
    custom_clip = hooks.module_overrides("configure_gradient_clipping") or hooks.module_overrides("clip_gradients")
    clip_hook = hooks.module_fn("configure_gradient_clipping")
    default_clip = hooks.timed(_hook_action(module, "configure_gradient_clipping"), clip_gradients)
    zero_grad = hooks.timed(_hook_action(module, "optimizer_zero_grad"), optimizer.zero_grad)
    clip_val, clip_algorithm = run.settings.gradient_clip_val, run.settings.gradient_clip_algorithm
    reevaluates = isinstance(optimizer, torch.optim.LBFGS)  # calls its closure again: give it one
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


def _hook_action(module: Any, name: str) -> str:
    """The action name of a hook whose default fw runs inline (what Lightning's default does)."""
    return f"[LightningModule]{type(module).__name__}.{name}"


def _loss_of(outputs: dict) -> Any:
    if "loss" not in outputs:
        raise TrainingError(
            f"training_step returned a dict without 'loss' (keys: {', '.join(map(str, outputs)) or 'none'}); "
            "put the loss to optimise under 'loss', or return None to skip the batch"
        )
    return outputs["loss"]


def clip_gradients(optimizer: torch.optim.Optimizer, value: float, algorithm: str) -> None:
    if value <= 0:
        return
    params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    if algorithm == "norm":
        torch.nn.utils.clip_grad_norm_(params, value)
    else:
        torch.nn.utils.clip_grad_value_(params, value)
