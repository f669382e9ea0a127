"""Check a recipe's value against the annotation of the argument it is given to, and convert it
where the conversion loses nothing (a YAML list for ``tuple[int, ...]``, an integer for a
``float``, a string for a ``Path`` or an ``Enum``).

A value that does not fit is a ``ConfigError`` naming the key: ``module.lr: expected a number
(float), got 'abc'``. Annotations fw cannot check (a class of the user's, a callable, a string
it cannot resolve) let the value through unchanged, as Python would.
"""

from __future__ import annotations

import enum
import inspect
import os
import sys
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import PurePath
from typing import Any, Literal, Union

from framework.errors import ConfigError

#: How a value of each plain type is named in an error (``expected an integer, got ...``); the
#: recipe's schema errors (recipe.py) name them alike.
PLAIN_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


class _Mismatch(Exception):
    """The value does not fit; ``str`` is what was expected."""


def annotations_of(target: Any) -> dict[str, Any]:
    """The resolved annotations of ``target``'s arguments (its ``__init__`` for a class); one
    that cannot be resolved is left out."""
    function = target.__init__ if inspect.isclass(target) else target
    try:
        return typing.get_type_hints(function)
    except Exception:  # one unresolvable name (a TYPE_CHECKING import): resolve the others one by one
        pass
    raw = getattr(function, "__annotations__", {}) or {}
    namespace = vars(sys.modules[function.__module__]) if function.__module__ in sys.modules else {}
    hints = {}
    for name, annotation in raw.items():
        try:
            hints[name] = eval(annotation, dict(namespace)) if isinstance(annotation, str) else annotation
        except Exception:
            continue
    return hints


def coerce(value: Any, annotation: Any, key: str) -> Any:
    """``value`` as the argument annotated ``annotation`` takes it, or a ConfigError naming ``key``."""
    try:
        return _coerce(value, annotation)
    except _Mismatch as err:
        raise ConfigError(mismatch_message(key, str(err), value)) from None


def mismatch_message(key: str, expected: str, value: Any) -> str:
    """The line for a value of the wrong type (also for the schema's keys: recipe.py)."""
    return f"{key}: expected {expected}, got {value!r}; fix the value in the recipe or the override"


def _coerce(value: Any, annotation: Any) -> Any:
    if annotation is Any or annotation is inspect.Parameter.empty or isinstance(annotation, (str, typing.TypeVar)):
        return value
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (Union, types.UnionType):
        return _coerce_union(value, args)
    if origin is Literal:
        return _coerce_literal(value, args)
    if annotation in PLAIN_NAMES:
        return _coerce_plain(value, annotation)
    if inspect.isclass(annotation) and issubclass(annotation, enum.Enum):
        return _coerce_enum(value, annotation)
    if inspect.isclass(annotation) and issubclass(annotation, (PurePath, os.PathLike)):
        if not isinstance(value, (str, PurePath)):
            raise _Mismatch("a path")
        return annotation(value) if issubclass(annotation, PurePath) else value
    if origin in (tuple, list, set, frozenset) or origin in (Sequence, typing.Sequence):
        return _coerce_sequence(value, origin, args)
    if origin in (dict, Mapping, typing.Mapping):
        return _coerce_mapping(value, args)
    if annotation in (list, tuple, set, frozenset):
        return _coerce_sequence(value, annotation, ())
    if annotation is dict:
        return _coerce_mapping(value, ())
    return value  # a class of the user's, a callable, a protocol: Python does not check it either


def _coerce_literal(value: Any, args: tuple) -> Any:
    if value in args:
        return value
    raise _Mismatch("one of " + ", ".join(repr(a) for a in args))


def _coerce_union(value: Any, args: tuple) -> Any:
    members = [a for a in args if a is not type(None)]
    nullable = " or null" if len(members) < len(args) else ""
    if value is None:
        if nullable:
            return None
        raise _Mismatch(" or ".join(_describe(a) for a in members))
    # an exact fit first: 3 for int | float stays an int, "3" for int | str stays a string
    for member in members:
        if member in PLAIN_NAMES and type(value) is member:
            return value
    expected = []
    for member in members:
        try:
            return _coerce(value, member)
        except _Mismatch as err:
            expected.append(str(err))
    raise _Mismatch((expected[0] if len(members) == 1 else " or ".join(_describe(a) for a in members)) + nullable)


def _coerce_plain(value: Any, kind: type) -> Any:
    if type(value) is kind:
        return value
    if kind is float and type(value) is int:
        return float(value)
    if kind is str and type(value) is int:  # module.name=123: the digits as written
        return str(value)
    raise _Mismatch(f"{PLAIN_NAMES[kind]} ({kind.__name__})")


def _coerce_enum(value: Any, kind: type[enum.Enum]) -> Any:
    if isinstance(value, kind):
        return value
    for member in kind:
        if value == member.name or value == member.value:
            return member
    raise _Mismatch("one of " + ", ".join(repr(m.name) for m in kind))


def _coerce_sequence(value: Any, origin: Any, args: tuple) -> Any:
    if not isinstance(value, (list, tuple)):
        raise _Mismatch(f"a list ({_describe(origin)})")
    if origin is tuple and args and args[-1] is not Ellipsis:
        if len(args) != len(value):
            raise _Mismatch(f"a list of {len(args)} items")
        return tuple(_coerce(v, a) for v, a in zip(value, args, strict=True))
    item = args[0] if args else Any
    items = [_coerce(v, item) for v in value]
    return origin(items) if origin in (tuple, set, frozenset) else items


def _coerce_mapping(value: Any, args: tuple) -> Any:
    if not isinstance(value, dict):
        raise _Mismatch("a mapping")
    if not args:
        return value
    return {_coerce(k, args[0]): _coerce(v, args[1]) for k, v in value.items()}


def _describe(annotation: Any) -> str:
    if annotation is type(None):
        return "null"
    if annotation in PLAIN_NAMES:
        return PLAIN_NAMES[annotation]
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")
