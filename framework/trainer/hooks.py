"""The one way hooks are called: ``HookDispatcher``, built once per run.

Ordering rules (Lightning's), all of them here:

1. ``hooks(name, *args)``: the callbacks (in the Trainer's order, ModelCheckpoint last so that
   it sees what early stopping and the others decided), then the module.
2. Epoch ends (``on_train_epoch_end``, ``on_validation_epoch_end``, ...): the module alone first
   (``hooks.module_hook(name)``), then the loop computes the epoch's metrics, then the callbacks alone
   (``hooks.callbacks(name)``), so that checkpointing and early stopping see what the module
   logged at its epoch end.
3. ``setup``, ``teardown``, ``on_exception``, ``on_sanity_check_*`` and the checkpoint hooks go
   to the callbacks only (``hooks.callbacks``); the module's own ``setup``/``teardown`` are
   called by set-up, and its checkpoint hooks by the checkpointing code, before the callbacks'.
   Evaluation and predict ``on_*_start``/``_end`` and batch hooks follow rule 1, with
   ``dataloader_idx`` added when there are several loaders, as in Lightning.

Hooks nobody overrides cost nothing: at set-up the dispatcher records, per hook, only the
callbacks that override it, and ``per_batch(name)`` returns ``None`` for a per-batch hook that
neither the module nor any callback overrides, so the loop skips it without a call.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from framework.callbacks.base import Callback

_CALLBACK_HOOKS = [name for name in vars(Callback) if name.startswith(("on_", "setup", "teardown"))]


class HookDispatcher:
    def __init__(self, callbacks: Sequence[Callback], trainer: Any, module: Any) -> None:
        self.trainer, self.module = trainer, module
        self._by_hook: dict[str, tuple] = {
            hook: tuple(getattr(cb, hook) for cb in callbacks if overrides(cb, Callback, hook))
            for hook in _CALLBACK_HOOKS
        }

    def __call__(self, name: str, *args: Any) -> None:
        """The callbacks' hook, then the module's (rule 1)."""
        self.callbacks(name, *args)
        self.module_hook(name, *args)

    def callbacks(self, name: str, *args: Any) -> None:
        for fn in self._by_hook[name]:
            fn(self.trainer, self.module, *args)

    def module_hook(self, name: str, *args: Any) -> None:
        fn = getattr(self.module, name, None)
        if fn is not None:
            fn(*args)

    def per_batch(self, name: str) -> Callable[..., None] | None:
        """One callable for a per-batch hook (callbacks, then the module), or None when nobody
        overrides it. Looked up once per epoch, not per batch."""
        from framework.module import TrainModule

        module_fn = getattr(self.module, name) if overrides(self.module, TrainModule, name) else None
        callbacks = self._by_hook[name]
        if not callbacks:
            return module_fn
        trainer, module = self.trainer, self.module

        def call(*args: Any) -> None:
            for fn in callbacks:
                fn(trainer, module, *args)
            if module_fn is not None:
                module_fn(*args)

        return call


def overrides(obj: Any, base: type, name: str) -> bool:
    """Does ``obj``'s class override ``base.name``?"""
    return getattr(type(obj), name, None) is not getattr(base, name, None)
