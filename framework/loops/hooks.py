"""The one way hooks are called: ``HookDispatcher``, built once per run.

Ordering rules (Lightning's), all of them here:

1. ``hooks(name, *args)``: the callbacks (in the Trainer's order, ModelCheckpoint last so that
   it sees what early stopping and the others decided), then the module.
2. ``on_train_epoch_end``: the callbacks that monitor nothing, then the module, then the
   monitoring ones (EarlyStopping, ModelCheckpoint: ``hooks.train_epoch_end``), so that those see
   what the module logged at its epoch end. Every epoch-end hook sees the epoch just finished
   in ``trainer.callback_metrics``: the loop computes the epoch's values before it calls them.
3. ``setup``, ``teardown``, ``on_exception``, ``on_sanity_check_*`` and the checkpoint hooks go
   to the callbacks only (``hooks.callbacks``); the module's own ``setup``/``teardown`` are
   called by set-up, and its checkpoint hooks by the checkpointing code, after the callbacks'.
   Evaluation and predict ``on_*_start``/``_end`` and batch hooks follow rule 1, with
   ``dataloader_idx`` added when there are several loaders, as in Lightning.

Hooks nobody overrides cost nothing: at set-up the dispatcher records, per hook, only the
callbacks that override it, and ``per_batch(name)`` returns ``None`` for a per-batch hook that
neither the module nor any callback overrides, so the loop skips it without a call.

Profiling (``Trainer(profiler=...)``) happens here too: with a profiler, each callable the
dispatcher hands out or calls is recorded under Lightning's action name (``timed``,
``framework/profilers/timing.py``); without one, the callables are the hooks themselves.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from framework.callbacks.base import Callback
from framework.profilers import timing

if TYPE_CHECKING:
    from framework.module import TrainModule
    from framework.run_state.metrics import LoggedMetrics
    from framework.trainer import Trainer

_CALLBACK_HOOKS = [name for name in vars(Callback) if name.startswith(("on_", "setup", "teardown"))]
F = TypeVar("F", bound=Callable[..., Any])


class HookDispatcher:
    def __init__(self, callbacks: Sequence[Callback], trainer: Trainer, module: TrainModule,
                 metrics: LoggedMetrics) -> None:
        from framework.callbacks import EarlyStopping, ModelCheckpoint

        self.trainer, self.module, self.metrics = trainer, module, metrics
        #: what times the hooks (None: nothing is timed)
        self.profiler = timing.active(getattr(trainer, "profiler", None))
        self._by_hook: dict[str, tuple] = {
            hook: tuple(self._callback_fn(cb, hook) for cb in callbacks if overrides(cb, Callback, hook))
            for hook in _CALLBACK_HOOKS
        }
        monitoring = [isinstance(cb, (EarlyStopping, ModelCheckpoint)) for cb in callbacks]
        ends = [(self._callback_fn(cb, "on_train_epoch_end"), m) for cb, m in zip(callbacks, monitoring, strict=True)
                if overrides(cb, Callback, "on_train_epoch_end")]
        self._epoch_end = (tuple(fn for fn, m in ends if not m), tuple(fn for fn, m in ends if m))

    def __call__(self, name: str, *args: Any) -> Any:
        """The callbacks' hook, then the module's (rule 1); the module's result."""
        self.callbacks(name, *args)
        return self.module_hook(name, *args)

    def callbacks(self, name: str, *args: Any, **kwargs: Any) -> None:
        callbacks = self._by_hook[name]
        if not callbacks:
            return
        with self.running(name):
            for fn in callbacks:
                fn(self.trainer, self.module, *args, **kwargs)

    def module_hook(self, name: str, *args: Any, **kwargs: Any) -> Any:
        fn = getattr(self.module, name, None)
        if fn is None:
            return None
        with self.running(name):
            return (fn if self.profiler is None else self.module_fn(name))(*args, **kwargs)

    @contextlib.contextmanager
    def running(self, name: str) -> Iterator[None]:
        """Hook ``name`` runs inside: what ``self.log`` may do there (``trainer/log_options.py``)."""
        metrics = self.metrics
        outer, metrics.fx = metrics.fx, name
        try:
            yield
        finally:
            metrics.fx = outer

    def module_fn(self, name: str) -> Callable[..., Any]:
        """The module's ``name`` method (timed as ``[LightningModule]{Module}.{name}``)."""
        return self.timed(f"[LightningModule]{type(self.module).__name__}.{name}", getattr(self.module, name))

    def datamodule_hook(self, datamodule: Any, name: str, *args: Any) -> Any:
        """The DataModule's ``name`` hook (timed as ``[LightningDataModule]{DataModule}.{name}``)."""
        return self.timed(f"[LightningDataModule]{type(datamodule).__name__}.{name}", getattr(datamodule, name))(*args)

    def strategy_fn(self, name: str, fn: F) -> F:
        """``fn``, the strategy's ``name`` step (timed as ``[Strategy]{Strategy}.{name}``)."""
        return self.timed(f"[Strategy]{type(self.trainer.strategy).__name__}.{name}", fn)

    def timed(self, action: str, fn: F) -> F:
        """``fn`` itself without a profiler, else ``fn`` recorded as ``action`` at each call."""
        return timing.timed(self.profiler, action, fn)

    def profiled(self, action: str) -> contextlib.AbstractContextManager:
        """A block recorded as ``action`` (once per epoch or run; nothing without a profiler)."""
        return timing.profiled(self.profiler, action)

    def fetching(self, iterator: Iterator[Any], action: str, count: float) -> Iterator[Any]:
        """``iterator``, its first ``count`` fetches recorded as ``action`` (with a profiler)."""
        return timing.fetching(self.profiler, iterator, action, count)

    def _callback_fn(self, callback: Callback, name: str) -> Callable[..., Any]:
        return self.timed(f"[Callback]{callback.state_key}.{name}", getattr(callback, name))

    def train_epoch_end(self, monitoring: bool) -> None:
        """Rule 2 in two calls: ``monitoring=False``, the other callbacks then the module;
        ``monitoring=True``, EarlyStopping and ModelCheckpoint (the loop does its epoch-end
        work between the two)."""
        others, monitors = self._epoch_end
        with self.running("on_train_epoch_end"):
            for fn in monitors if monitoring else others:
                fn(self.trainer, self.module)
        if not monitoring:
            self.module_hook("on_train_epoch_end")

    def epoch_end_may_log(self, name: str) -> bool:
        """Could an epoch-end hook ``name`` log (``self.log``) before the loop computes its
        second pass? Something runs there: the module's, or a callback's (for
        ``on_train_epoch_end`` the monitoring ones run after that pass and do not count)."""
        callbacks = self._epoch_end[0] if name == "on_train_epoch_end" else self._by_hook[name]
        return bool(callbacks) or self.module_overrides(name)

    def module_overrides(self, name: str) -> bool:
        from framework.module import TrainModule

        return overrides(self.module, TrainModule, name)

    def per_batch(self, name: str) -> Callable[..., Any] | None:
        """One callable for a per-batch hook (callbacks, then the module; it returns what the
        module's returned), or None when nobody overrides it. Looked up once per epoch."""
        module_fn = self.module_fn(name) if self.module_overrides(name) else None
        callbacks = self._by_hook[name]
        if not callbacks:
            return module_fn
        trainer, module = self.trainer, self.module

        def call(*args: Any) -> Any:
            for fn in callbacks:
                fn(trainer, module, *args)
            return module_fn(*args) if module_fn is not None else None

        return call


def overrides(obj: Any, base: type, name: str) -> bool:
    """Does ``obj``'s class override ``base.name``, or ``obj`` itself hold one (``LambdaCallback``:
    Lightning calls what the instance has)?"""
    return getattr(type(obj), name, None) is not getattr(base, name, None) or name in getattr(obj, "__dict__", ())
