"""``_target_`` + keyword arguments -> object, with errors that carry the key's full path."""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from framework.config.coerce import annotations_of, coerce
from framework.errors import ConfigError, did_you_mean


def locate(target: str, path: str) -> Any:
    """Import ``pkg.module.Name`` (the longest importable module prefix, then attributes)."""
    if not isinstance(target, str) or not target or target.startswith(".") or ".." in target:
        raise ConfigError(f"{path}._target_: '{target}' is not a dotted path like package.module.Class")
    parts = target.split(".")
    module, last_error = None, None
    for i in range(len(parts), 0, -1):
        try:
            module = importlib.import_module(".".join(parts[:i]))
            break
        except ModuleNotFoundError as err:
            last_error = err
            if err.name and not ".".join(parts[:i]).startswith(err.name):
                raise  # a module that exists failed to import one of its own dependencies
    if module is None:
        raise ConfigError(f"{path}._target_: cannot import '{target}' ({last_error}); check the spelling and that it is installed")
    obj = module
    for j, attr in enumerate(parts[i:], start=i):
        if not hasattr(obj, attr):
            known = [n for n in dir(obj) if not n.startswith("_")]
            raise ConfigError(
                f"{path}._target_: '{'.'.join(parts[:j])}' has no '{attr}'{did_you_mean(attr, known)}"
            )
        obj = getattr(obj, attr)
    return obj


def instantiate(node: Any, path: str) -> Any:
    """Build the object that ``node`` describes; nested ``_target_`` mappings are built first.

    Wrong keyword arguments are a ConfigError naming ``path`` (checked against the signature
    before the call, so errors raised inside the constructor keep their traceback).
    """
    if isinstance(node, list):
        return [instantiate(v, f"{path}[{i}]") for i, v in enumerate(node)]
    if not isinstance(node, dict):
        return node
    if "_target_" not in node:
        return {k: instantiate(v, f"{path}.{k}") for k, v in node.items()}
    kwargs = {k: instantiate(v, f"{path}.{k}") for k, v in node.items() if k != "_target_"}
    target = locate(node["_target_"], path)
    if not callable(target):
        raise ConfigError(f"{path}._target_: '{node['_target_']}' is not a class or function")
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        signature = None
    if signature is not None:
        try:
            signature.bind(**kwargs)
        except TypeError as err:
            raise ConfigError(f"{path}: {_explain_bind_error(err, kwargs, signature)}") from None
        kwargs = _checked(target, signature, kwargs, path)
    return target(**kwargs)


def _checked(target: Any, signature: inspect.Signature, kwargs: dict, path: str) -> dict:
    """Each argument checked against its annotation and converted where nothing is lost (see
    coerce.py); an argument that ``**kwargs`` takes is passed as it is."""
    hints = annotations_of(target)
    return {k: coerce(v, hints[k], f"{path}.{k}") if k in signature.parameters and k in hints else v
            for k, v in kwargs.items()}


def _explain_bind_error(err: TypeError, kwargs: dict, signature: inspect.Signature) -> str:
    params = [p for p in signature.parameters if p not in ("self", "args", "kwargs")]
    unknown = [k for k in kwargs if k not in signature.parameters]
    if unknown and not any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values()):
        key = unknown[0]
        accepted = ", ".join(params) or "none (it takes no arguments)"
        return f"unknown argument '{key}'{did_you_mean(key, params)}; accepted: {accepted}"
    return f"{err}; accepted: {', '.join(params) or 'none'}"
