"""One dispatcher for callback hooks.

At set-up it records, per hook, only the callbacks that override it, so calling a hook that
nobody implements is one dictionary lookup and an empty loop (nothing is allocated per step).
"""

from __future__ import annotations

from typing import Any, Sequence

from framework.callbacks.base import Callback

_HOOKS = [name for name in vars(Callback) if name.startswith(("on_", "setup", "teardown"))]


class HookDispatcher:
    def __init__(self, callbacks: Sequence[Callback], trainer: Any, module: Any = None) -> None:
        self.trainer, self.module = trainer, module
        self.callbacks = list(callbacks)
        self._by_hook: dict[str, tuple] = {
            hook: tuple(
                getattr(cb, hook) for cb in self.callbacks if overrides(cb, Callback, hook)
            )
            for hook in _HOOKS
        }

    def has(self, hook: str) -> bool:
        return bool(self._by_hook[hook])

    def __call__(self, hook: str, *args: Any) -> None:
        for fn in self._by_hook[hook]:
            fn(self.trainer, self.module, *args)


def overrides(obj: Any, base: type, name: str) -> bool:
    """Does ``obj``'s class override ``base.name``?"""
    return getattr(type(obj), name, None) is not getattr(base, name, None)
