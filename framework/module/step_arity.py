"""How many positional arguments a module's step takes: ``training_step(self, batch)`` is called
without ``batch_idx``, as Lightning calls it, and a step that takes ``*args`` gets them all."""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable
from typing import Any

#: the arity of a function that takes ``*args``: an int, so that ``args[:arity]`` keeps them all
ANY_NUMBER = sys.maxsize


def positional_arity(fn: Callable[..., Any]) -> int:
    """How many positional arguments ``fn`` takes (``ANY_NUMBER`` with ``*args``): a step written
    as ``training_step(self, batch)`` is called without ``batch_idx``, as Lightning does. A bound
    method's is its function's less ``self``, read once per function (each call binds anew)."""
    func = getattr(fn, "__func__", None)
    if func is None or getattr(fn, "__self__", None) is None:
        return _arity(fn)
    arity = _ARITIES.get(func)
    if arity is None:
        arity = _ARITIES[func] = _arity(func)
    return arity if arity == ANY_NUMBER or arity == 0 else arity - 1


#: functions' arities, kept as long as the function lives (a class's methods: the process)
_ARITIES: weakref.WeakKeyDictionary[Callable[..., Any], int] = weakref.WeakKeyDictionary()


def _arity(fn: Callable[..., Any]) -> int:
    import inspect

    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return ANY_NUMBER
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
        return ANY_NUMBER
    return sum(p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in params)
