"""Manual optimization (``self.automatic_optimization = False``), with Lightning's meaning.

The module drives its optimizers itself in ``training_step``::

    opt_g, opt_d = self.optimizers()
    self.toggle_optimizer(opt_g)
    self.manual_backward(g_loss)
    opt_g.step()
    opt_g.zero_grad()
    self.untoggle_optimizer(opt_g)

The loop then runs ``training_step`` and nothing else: no backward of a returned loss, no
optimizer or LR-scheduler step (the module steps its schedulers, ``self.lr_schedulers()``),
no automatic clipping or accumulation (both refused, as in Lightning: the module clips with
``self.clip_gradients`` and accumulates by stepping when it chooses). ``trainer.global_step``
counts optimizer steps, each ``opt.step()`` one, as in Lightning.

What fw does for the module, per ``TrainOptimizer.step``:

- **Gradients across ranks.** The step runs outside DDP's reducer (inside ``no_sync``), so any
  number of ``manual_backward`` calls per step is allowed (a GAN's two losses through shared
  parameters included). Before an optimizer steps, or its gradients are clipped, the gradients
  of its parameters are averaged over the ranks in one flat all-reduce. Averaging is linear, so
  this equals DDP's per-backward all-reduce; it also leaves accumulation (several backwards,
  one step) with one all-reduce instead of one per backward.
- **Precision.** ``manual_backward`` scales the loss under ``16-mixed``; the step unscales
  (once, also when ``clip_gradients`` already did), steps through the GradScaler and updates it.
- **Hooks.** ``on_before_backward``/``on_after_backward`` around each ``manual_backward``, which
  calls the module's ``backward``,
  ``on_before_optimizer_step`` before each step (gradients averaged and unscaled).
- **Non-finite losses** (``trainer.on_nonfinite``) are checked in ``manual_backward``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from framework.errors import ConfigError
from framework.module.step_arity import positional_arity

if TYPE_CHECKING:
    from framework.loops.nonfinite import NonfiniteGuard
    from framework.trainer import Trainer
    from framework.trainer.run import Run


def check_manual_settings(run: Run) -> None:
    """Settings that automatic optimization needs and manual optimization cannot honour."""
    if run.settings.accumulate_grad_batches != 1:
        raise ConfigError(
            f"trainer.accumulate_grad_batches={run.settings.accumulate_grad_batches}: automatic gradient accumulation "
            "is not supported with manual optimization (self.automatic_optimization = False); remove it and step "
            "the optimizers every N batches in training_step"
        )
    if run.settings.gradient_clip_val:
        raise ConfigError(
            f"trainer.gradient_clip_val={run.settings.gradient_clip_val}: automatic gradient clipping is not supported "
            "with manual optimization; remove it and call self.clip_gradients(opt, gradient_clip_val=...) "
            "in training_step before opt.step()"
        )


class ManualOptimization:
    """The run's side of manual optimization: ``run.manual`` while a manual fit runs."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.backwards = 0  # manual_backward calls so far: gradients changed since a sync?
        self._synced: dict[int, int] = {}  # id(optimizer) -> backwards when last averaged
        self._unscaled: set[int] = set()  # optimizers unscaled since their last step
        self.batch_idx = 0
        self._guard: NonfiniteGuard | None = None
        self._profiled_step = run.hooks.timed("optimizer_step", self._step)  # Lightning's name in manual optimization

    # -- per epoch / per batch ----------------------------------------------------------------
    def step_fn(self, guard: NonfiniteGuard) -> Callable[[Any, int, bool], Any]:
        """``(batch, batch_idx, _) -> outputs``: ``training_step`` under autocast, outside DDP's
        reducer; the loop does nothing else with the outputs."""
        run = self.run
        strategy, precision = run.strategy, run.precision
        step = run.hooks.strategy_fn("training_step", precision.converting(strategy.training_step_fn(run.module)))
        with_idx = positional_arity(run.module.training_step) >= 2
        no_sync = strategy.no_sync if strategy.multi_process else None
        autocast = precision.forward_context if precision.has_forward_context else None
        self._guard = guard
        self._before_backward = run.hooks.per_batch("on_before_backward")
        self._after_backward = run.hooks.per_batch("on_after_backward")
        self._before_step = run.hooks.per_batch("on_before_optimizer_step")
        module = run.module
        backward = module.backward if run.hooks.module_overrides("backward") else torch.Tensor.backward
        self._backward = run.hooks.strategy_fn("backward", strategy.manual_backward_fn(backward))

        def manual_step(batch: Any, batch_idx: int, _sync: bool) -> Any:
            self.batch_idx = batch_idx
            with (no_sync() if no_sync is not None else contextlib.nullcontext(),
                  autocast() if autocast is not None else contextlib.nullcontext()):
                return step(batch, batch_idx) if with_idx else step(batch)

        return manual_step

    # -- what the module calls ------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        state = self.run.state
        if self._guard is not None:
            checked = self._guard(loss, self.batch_idx)
            if checked is None or state.skip_step:  # on_nonfinite=skip: this loss adds nothing
                state.skip_step = False
                return
        scaler = self.run.precision.scaler
        if scaler is not None:  # the hooks and backward see the scaled loss, as in Lightning
            loss = scaler.scale(loss)
        if self._before_backward is not None:
            self._before_backward(loss)
        self._backward(loss, *args, **kwargs)
        self.backwards += 1
        if self._after_backward is not None:
            self._after_backward()

    def prepare_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        """Average ``optimizer``'s gradients over the ranks (if a backward changed them since)
        and unscale them (16-mixed): what clipping and the step need to see."""
        key = id(optimizer)
        if self._synced.get(key) != self.backwards:
            params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
            self.run.strategy.average_gradients(params)
            self._synced[key] = self.backwards
        if self.run.precision.scaler is not None and key not in self._unscaled:
            self.run.precision.unscale(optimizer)
            self._unscaled.add(key)

    def step(self, optimizer: torch.optim.Optimizer, closure: Callable[[], Any] | None, **kwargs: Any) -> Any:
        return self._profiled_step(optimizer, closure, **kwargs)

    def _step(self, optimizer: torch.optim.Optimizer, closure: Callable[[], Any] | None, **kwargs: Any) -> Any:
        precision = self.run.precision

        def before_update() -> None:
            self.prepare_gradients(optimizer)
            if self._before_step is not None:
                self._before_step(optimizer)

        if precision.scaler is not None:
            result = closure() if closure is not None else None
            before_update()
            precision.scaler.step(optimizer, **kwargs)
            precision.scaler.update()
        elif closure is not None:
            def wrapped() -> Any:
                out = closure()
                before_update()
                return out

            result = optimizer.step(closure=wrapped, **kwargs)
        else:
            before_update()
            result = optimizer.step(**kwargs)
        self.run.strategy.after_manual_step()
        self._unscaled.discard(id(optimizer))
        self.run.state.global_step += 1
        return result


def _of_the_optimizer(name: str) -> property:
    """The wrapped optimizer's attribute ``name``, read and written through the wrapper."""
    return property(lambda self: getattr(self.optimizer, name), lambda self, value: setattr(self.optimizer, name, value))


class TrainOptimizer:
    """What ``self.optimizers()`` returns (Lightning's ``LightningOptimizer``, also exported under
    that name): the optimizer, whose ``step`` averages gradients over ranks, unscales, runs
    ``on_before_optimizer_step`` and counts the step. It is an instance of the wrapped optimizer's
    class, as Lightning's is (``isinstance(opt, torch.optim.SGD)``); everything but ``step`` is
    the wrapped optimizer's (``param_groups``, ``state``, ``zero_grad``, ``state_dict``), and
    ``.optimizer`` is the optimizer itself."""

    def __init__(self, optimizer: torch.optim.Optimizer, trainer: Trainer) -> None:
        self.__dict__["optimizer"] = optimizer
        self.__dict__["_trainer"] = trainer
        #: in automatic optimization, what ``step(closure)`` does (``loops/training_step.py``)
        self.__dict__["automatic_step"] = None
        cls = optimizer.__class__  # imitated, so that isinstance checks against it hold, as in Lightning
        object.__setattr__(self, "__class__", type("Lightning" + cls.__name__, (TrainOptimizer, cls), {}))

    # the wrapped optimizer's state, never a copy in the wrapper: the Optimizer methods this
    # class inherits would otherwise write their own (load_state_dict replaces param_groups)
    param_groups = _of_the_optimizer("param_groups")
    state = _of_the_optimizer("state")
    defaults = _of_the_optimizer("defaults")

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state_dict)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self.optimizer.add_param_group(param_group)

    def use_automatic_step(self, step: Callable[..., Any] | None) -> None:
        self.__dict__["automatic_step"] = step

    def step(self, closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:
        run = self._trainer.run
        manual = run.manual if run is not None else None
        if manual is None:  # automatic optimization: optimizer_step's step (loops/training_step.py)
            if self.automatic_step is not None:
                return self.automatic_step(closure, **kwargs)
            return self.optimizer.step(closure=closure, **kwargs) if closure else self.optimizer.step(**kwargs)
        if closure is not None and not callable(closure):
            raise ConfigError("optimizer.step(closure): the closure must be callable")
        return manual.step(self.optimizer, closure, **kwargs)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    @contextlib.contextmanager
    def toggle_model(self, sync_grad: bool = True) -> Iterator[None]:
        """Only this optimizer's parameters get gradients inside (``toggle_optimizer``).
        ``sync_grad`` is accepted for Lightning's sake: fw averages at the step anyway."""
        module = self._trainer.lightning_module
        module.toggle_optimizer(self)
        try:
            yield
        finally:
            module.untoggle_optimizer(self)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["optimizer"], name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.optimizer, name, value)

    def __repr__(self) -> str:
        return f"LightningOptimizer({self.optimizer!r})"

    def __reduce__(self) -> Any:  # a copy or a pickle is of the optimizer itself
        return _itself, (self.optimizer,)


def _itself(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    return optimizer


#: Lightning's name, for code that imports it (``isinstance(opt, LightningOptimizer)``)
LightningOptimizer = TrainOptimizer
