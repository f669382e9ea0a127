"""One training batch in automatic optimization, read top to bottom, each Lightning hook in
Lightning's place.

Before it the epoch (``training_epoch.py``) moves the batch to the device (``transfer.py``:
``on_before_batch_transfer``, ``transfer_batch_to_device``, ``on_after_batch_transfer``) and
calls ``on_train_batch_start``; after it, the epoch counts the step and calls
``on_train_batch_end``. The batch itself (``train_batch``, built once per epoch by
``automatic_step_fn``):

1. ``training_step``, through the strategy's wrapper, under autocast (``forward_and_backward``);
2. the loss checked (``trainer.on_nonfinite``, ``nonfinite.py``; a batch ``skip`` drops runs no
   backward, or where DDP expects one runs it, and 5-6 then drop its window's gradients);
3. on the first batch of an accumulation window, where something watches it:
   ``on_before_zero_grad``, ``optimizer_zero_grad``;
4. the loss divided by ``accumulate_grad_batches``, scaled under ``16-mixed``, then
   ``on_before_backward``, ``backward``, ``on_after_backward``. A batch that only accumulates
   (k-1 of every k) ends here, with 1-4 inside DDP's or FSDP's ``no_sync`` (no all-reduce);
5. the gradients unscaled under ``16-mixed``, ``on_before_optimizer_step``, clipping
   (``configure_gradient_clipping``, or the Trainer's ``gradient_clip_val``) (``clip_and_step``);
6. the optimizer's step, through the GradScaler;
7. ``zero_grad`` right after the step, where nothing watches it (else at 3 of the next window).

Lightning's ``optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)`` hands 1-4 to the
optimizer as a closure that ``optimizer.step(closure=...)`` calls before 5-7. fw builds that
closure (``Closure``) only where something can tell it is there: a module that overrides
``optimizer_step``, an optimizer that calls its closure again (LBFGS), a profiler (it records
``optimizer_step`` around 1-7). Elsewhere ``train_batch`` calls 1-4 and 5-7 itself: the same two
functions in the same order, without a closure object a batch. Every hook, override and setting is
looked up once, when the batch is built; a hook nobody overrides is not called, and a default
that does the obvious thing is done inline.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from framework.errors import ConfigError, TrainingError
from framework.intervals import every
from framework.loops.nonfinite import NonfiniteGuard, nonfinite_guard
from framework.module.step_arity import positional_arity
from framework.optim import clip_gradients
from framework.strategies.base import inside
from framework.waiting import waiting_in

if TYPE_CHECKING:
    from framework.trainer.run import Run

_NO_CONTEXT = contextlib.nullcontext()
_CLIPPING = ("configure_gradient_clipping", "clip_gradients")  # overriding either clips the module's own way


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
    """``train_batch(batch, batch_idx, steps_now) -> outputs`` of ``training_step``, and what the
    epoch's end calls to read the loss checks still pending (``nonfinite.py``)."""
    module, state, hooks, strategy = run.module, run.state, run.hooks, run.strategy
    optimizer = run.optimizers[0]
    wrapped = module.optimizers()  # what optimizer_step gets: Lightning's LightningOptimizer
    user_step = hooks.module_fn("optimizer_step") if hooks.module_overrides("optimizer_step") else None
    reevaluates = isinstance(optimizer, torch.optim.LBFGS)  # its step calls the closure again
    # Where nothing sees when the gradients are zeroed, zero them right after the step, as a
    # hand-written loop does (the same numbers; the old gradients are freed before the next
    # forward: measurably faster on the CPU). Else at each window's start (3), and in each call
    # of LBFGS's closure, which it calls several times a step: each sees its own gradients.
    zero_after_step = user_step is None and not reevaluates and not hooks.module_overrides("optimizer_zero_grad") \
        and hooks.per_batch("on_before_zero_grad") is None
    if zero_after_step:
        optimizer.zero_grad()  # gradients left from before this epoch (a backward outside fit) do not count
    guard = nonfinite_guard(run)
    forward_and_backward = forward_and_backward_fn(run, optimizer, guard, zero_at_window_start=not zero_after_step)
    clip_and_step = clip_and_step_fn(run, optimizer, zero_after_step, reevaluates)

    def step(closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:
        """What ``optimizer.step(closure=...)`` does in automatic optimization: 1-4, then 5-7."""
        return clip_and_step(closure() if closure is not None else None, closure, **kwargs)

    wrapped.use_automatic_step(step)
    with_closure = user_step is not None or reevaluates or hooks.profiler is not None
    default_step = hooks.timed(hook_action(module, "optimizer_step"), step)  # what Lightning's default does
    accumulates = run.settings.accumulate_grad_batches > 1
    no_sync = strategy.no_sync if strategy.multi_process and accumulates else None
    replicas = strategy.replicas  # ``ft``: each step's quorum at its first batch (strategies/ft/replicas.py)

    def train_batch(batch: Any, batch_idx: int, steps_now: bool) -> Any:
        if replicas is not None:
            replicas.before_batch(state.epoch, batch_idx, state.global_step)
        if not steps_now:  # the batch only accumulates: 1-4, and no gradient all-reduce
            if no_sync is None:
                return forward_and_backward(batch, batch_idx)[0]
            with no_sync():
                return forward_and_backward(batch, batch_idx)[0]
        if not with_closure:
            outputs, loss = forward_and_backward(batch, batch_idx)  # 1-4
            clip_and_step(loss)  # 5-7
            return outputs
        closure = Closure(forward_and_backward, batch, batch_idx)  # Lightning's optimizer_step contract
        if user_step is None:
            default_step(closure)  # optimizer.step(closure=closure)
            return closure.outputs
        user_step(state.epoch, batch_idx, wrapped, closure)
        if not closure.ran:
            raise ConfigError(
                f"{type(module).__name__}.optimizer_step did not call optimizer_closure, which runs "
                "training_step, zero_grad and backward: call optimizer.step(closure=optimizer_closure) "
                "(or optimizer_closure()) in it"
            )
        return closure.outputs

    return train_batch, guard.flush


def forward_and_backward_fn(run: Run, optimizer: torch.optim.Optimizer, guard: NonfiniteGuard,  # noqa: C901
                            zero_at_window_start: bool) -> Callable[[Any, int], tuple[Any, Any]]:
    # C901: steps 1-4 read top to bottom, one `if` per feature, as the file's docstring numbers them
    """1-4: ``(batch, batch_idx) -> (outputs of training_step, the loss its backward used)``;
    the loss is None for a batch that ran no backward (the step or the loss check skipped it)."""
    module, state, hooks, strategy, precision = run.module, run.state, run.hooks, run.strategy, run.precision
    training_step = hooks.strategy_fn("training_step", precision.converting(strategy.training_step_fn(module)))
    with_idx = positional_arity(module.training_step) >= 2  # training_step(self, batch) is allowed
    backward = hooks.strategy_fn("backward", module.backward if hooks.module_overrides("backward")
                                 else torch.Tensor.backward)
    autocast = precision.forward_context if precision.has_forward_context else None
    scaler, accumulate = precision.scaler, run.settings.accumulate_grad_batches
    before_zero_grad = hooks.per_batch("on_before_zero_grad")
    user_zero_grad = hooks.module_fn("optimizer_zero_grad") if hooks.module_overrides("optimizer_zero_grad") else None
    zero_grad = hooks.timed(hook_action(module, "optimizer_zero_grad"), optimizer.zero_grad)
    before_backward, after_backward = hooks.per_batch("on_before_backward"), hooks.per_batch("on_after_backward")
    marks = strategy.is_distributed  # where a rank waits, for the heartbeat and a collective's errors (waiting.py)
    in_step = waiting_in("training_step", user_code=True) if marks else _NO_CONTEXT
    in_backward = waiting_in("the backward pass's gradient sync")
    bare = autocast is None and not marks  # one process, no autocast: the step needs no context at all

    def forward_and_backward(batch: Any, batch_idx: int) -> tuple[Any, Any]:
        # 1. training_step
        if bare:
            outputs = training_step(batch, batch_idx) if with_idx else training_step(batch)
        else:
            with autocast() if autocast is not None else _NO_CONTEXT, in_step:
                outputs = training_step(batch, batch_idx) if with_idx else training_step(batch)
        # 2. the loss check
        loss = loss_of(outputs) if isinstance(outputs, dict) else outputs
        if loss is not None:
            loss = guard(loss, batch_idx)
        # 3. zero_grad at the window's start, where something watches it
        if zero_at_window_start and every(accumulate, batch_idx):
            if before_zero_grad is not None:
                before_zero_grad(optimizer)
            if user_zero_grad is not None:
                user_zero_grad(state.epoch, batch_idx, optimizer)
            else:
                zero_grad()
        if loss is None:  # the step chose to skip this batch (or the loss check did)
            return outputs, None
        # 4. the backward
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
        return outputs, loss

    if strategy.step_context() is not None:  # model_parallel's loss parallel: step and backward inside
        return inside(strategy.step_context, forward_and_backward)
    return forward_and_backward


def clip_and_step_fn(run: Run, optimizer: torch.optim.Optimizer, zero_after_step: bool, reevaluates: bool
                      ) -> Callable[..., Any]:
    """5-7: ``(loss of 1-4, closure or None, **the optimizer's step arguments) -> loss``; with
    LBFGS the closure is what its step calls again (each call then runs 5's hooks and clipping)."""
    module, state, hooks, precision = run.module, run.state, run.hooks, run.precision
    scaler = precision.scaler
    before_step = hooks.per_batch("on_before_optimizer_step")
    custom_clip = any(hooks.module_overrides(name) for name in _CLIPPING)
    clip_hook = hooks.module_fn("configure_gradient_clipping")
    default_clip = hooks.timed(hook_action(module, "configure_gradient_clipping"), clip_gradients)
    clip_val, clip_algorithm = run.settings.gradient_clip_val, run.settings.gradient_clip_algorithm
    between = before_step is not None or custom_clip or bool(clip_val)  # anything between 4 and 6
    zero_grad = hooks.timed(hook_action(module, "optimizer_zero_grad"), optimizer.zero_grad)
    step = optimizer.step if scaler is None else functools.partial(precision.step, optimizer)
    commit = _replicas_commit_fn(run, optimizer)  # ``ft``: the average across replica groups, and the commit

    def before_the_step() -> None:  # 5. on_before_optimizer_step, clipping
        if before_step is not None:
            before_step(optimizer)
        if custom_clip:
            clip_hook(optimizer, gradient_clip_val=clip_val, gradient_clip_algorithm=clip_algorithm)
        elif clip_val:
            default_clip(optimizer, float(clip_val), clip_algorithm or "norm")

    def clip_and_step(loss: Any, closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:
        # ``ft``: the gradients averaged over the replica groups; a step not committed is not applied.
        # A non-finite loss in this accumulation window (on_nonfinite=skip) is not applied either
        if (commit is not None and not commit()) or state.skip_step:
            state.skip_step = False
            optimizer.zero_grad(set_to_none=True)
            return loss
        if scaler is not None and loss is not None:
            precision.unscale(optimizer)  # hooks and clipping see the true gradients
        if between:
            before_the_step()
        result = loss
        if reevaluates and closure is not None and scaler is None:  # 6. LBFGS: its step calls again
            result = optimizer.step(closure=_again(loss, closure, before_the_step), **kwargs)
        elif scaler is None or loss is not None:  # 16-mixed without a backward: nothing to step (Lightning)
            step(**kwargs)  # 6
        if zero_after_step:
            zero_grad()  # 7
        return result

    return clip_and_step


def _replicas_commit_fn(run: Run, optimizer: torch.optim.Optimizer) -> Callable[[], bool] | None:
    """``ft``: ``() -> committed``, the gradients averaged over the replica groups and the step
    committed or not (``Replicas.commit``); a stop asked for on any group (``trainer.should_stop``)
    is agreed there too, so that every group stops after the same step. None without replicas."""
    replicas, state = run.strategy.replicas, run.state
    if replicas is None:
        return None

    def commit() -> bool:
        committed = replicas.commit(optimizer, usable=not state.skip_step, stop=state.should_stop)
        state.should_stop = state.should_stop or replicas.stop_agreed
        return committed

    return commit


def _again(loss: Any, closure: Callable[[], Any], before_the_step: Callable[[], None]) -> Callable[[], Any]:
    """What LBFGS's step calls: at first the loss 1-4 already gave, then 1-4 and 5 anew each call."""
    first = [True]

    def again() -> Any:
        if first[0]:
            first[0] = False
            return loss
        out = closure()
        before_the_step()
        return out

    return again


class Closure:
    """1-4 for one batch, as ``optimizer.step(closure)`` calls them: returns the loss its
    backward used; ``ran`` says whether it was called, ``outputs`` what ``training_step`` returned."""

    __slots__ = ("batch", "batch_idx", "forward_and_backward", "outputs", "ran")

    def __init__(self, forward_and_backward: Callable[[Any, int], tuple[Any, Any]], batch: Any, batch_idx: int) -> None:
        self.forward_and_backward, self.batch, self.batch_idx = forward_and_backward, batch, batch_idx
        self.ran, self.outputs = False, None

    def __call__(self) -> Any:
        self.ran = True
        self.outputs, loss = self.forward_and_backward(self.batch, self.batch_idx)
        return loss


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
