"""One batch's closure, what ``optimizer.step(closure)`` runs in automatic optimization:
``training_step`` (under autocast), the loss checked and divided for accumulation, zero_grad at
an accumulation window's start, and the backward between its hooks (``optimization.py`` says
where it runs; where nothing runs between these parts and the step, ``plain_batch_fn`` there
does their work without a closure)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from framework.counting import every
from framework.errors import TrainingError
from framework.loops.nonfinite import NonfiniteGuard
from framework.module.step_arity import positional_arity
from framework.strategies.base import inside
from framework.waits import waiting_in

if TYPE_CHECKING:
    from framework.trainer.run import Run

_NO_CONTEXT = contextlib.nullcontext()


class Closure:
    """One batch's closure, what ``optimizer.step(closure)`` calls: it returns the loss its
    backward used; ``ran`` says whether it was called, ``outputs`` what ``training_step`` returned."""

    __slots__ = ("body", "ran", "outputs")

    def __init__(self, body: Callable[[Closure], Any]) -> None:
        self.body, self.ran, self.outputs = body, False, None

    def __call__(self) -> Any:
        self.ran = True
        return self.body(self)


def training_step_and_backward(run: Run) -> tuple[Callable[..., Any], bool, Callable[[torch.Tensor], Any]]:
    """The training step as the loop calls it (through the strategy's wrapper, inputs converted
    to the precision's dtype), whether it takes ``batch_idx``, and the backward."""
    module, hooks, strategy = run.module, run.hooks, run.strategy
    step = hooks.strategy_fn("training_step", run.precision.converting(strategy.training_step_fn(module)))
    with_idx = positional_arity(module.training_step) >= 2  # training_step(self, batch) is allowed
    backward = hooks.strategy_fn("backward", module.backward if hooks.module_overrides("backward")
                                 else torch.Tensor.backward)
    return step, with_idx, backward


def closure_fn(run: Run, optimizer: torch.optim.Optimizer, guard: NonfiniteGuard, zero_in_closure: bool
               ) -> Callable[[Any, int], Closure]:
    """``(batch, batch_idx) -> closure`` (``Closure``)."""
    module, state, hooks, strategy, precision = (run.module, run.state, run.hooks,
                                                 run.strategy, run.precision)
    step, with_idx, backward = training_step_and_backward(run)
    accumulate = run.settings.accumulate_grad_batches
    autocast = precision.forward_context if precision.has_forward_context else None
    scaler = precision.scaler
    before_backward = hooks.per_batch("on_before_backward")
    after_backward = hooks.per_batch("on_after_backward")
    before_zero_grad = hooks.per_batch("on_before_zero_grad")
    zero_grad = hooks.module_fn("optimizer_zero_grad") if hooks.module_overrides("optimizer_zero_grad") else None
    default_zero_grad = hooks.timed(hook_action(module, "optimizer_zero_grad"), optimizer.zero_grad)
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
            loss = loss_of(outputs) if isinstance(outputs, dict) else outputs
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


def loss_of(outputs: dict) -> Any:
    if "loss" not in outputs:
        raise TrainingError(
            f"training_step returned a dict without 'loss' (keys: {', '.join(map(str, outputs)) or 'none'}); "
            "put the loss to optimise under 'loss', or return None to skip the batch"
        )
    return outputs["loss"]


def hook_action(module: Any, name: str) -> str:
    """The action name of a hook whose default fw runs inline (what Lightning's default does)."""
    return f"[LightningModule]{type(module).__name__}.{name}"
