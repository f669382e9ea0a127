"""A Sphinx extension: the build fails (a warning, and ``-W`` makes it an error) when a public name
of fw is not documented in the API reference.

The public names are ``framework.__all__`` (its exports) and the ``__all__`` of each public
package it names (``fw.callbacks``, ``fw.loggers``, ``fw.strategies``, ``fw.profilers``, ``fw.tuner``,
``fw.parallel``, ...). A name counts as documented when an ``auto*`` directive documented it under
the package users import it from (``framework.callbacks.ModelCheckpoint``) or, for a name that is
only re-exported, under any module (``framework.module.TrainModule`` for ``framework.TrainModule``)."""

from __future__ import annotations

import importlib
from typing import Any

from sphinx.application import Sphinx
from sphinx.util import logging

logger = logging.getLogger(__name__)


def public_names() -> dict[str, object]:
    """``{"framework.callbacks.ModelCheckpoint": <the object>, ...}`` for every public name."""
    framework = importlib.import_module("framework")
    names: dict[str, object] = {}
    for name in framework.__all__:
        value = getattr(framework, name)
        if getattr(value, "__name__", None) == f"framework.{name}":  # a public package
            for member in getattr(value, "__all__", ()):
                names[f"framework.{name}.{member}"] = getattr(value, member)
        else:
            names[f"framework.{name}"] = value
    return names


def check(app: Sphinx, env: Any) -> None:
    documented: dict[str, Any] = env.domaindata["py"]["objects"]
    by_object: set[int] = set()
    for full_name in documented:
        module_name, _, attribute = full_name.rpartition(".")
        try:
            by_object.add(id(getattr(importlib.import_module(module_name), attribute)))
        except (ImportError, AttributeError):
            continue  # a method or attribute of a class: its class is what counts
    missing = [name for name, value in public_names().items()
               if name not in documented and id(value) not in by_object]
    for name in sorted(missing):
        logger.warning("public name %s is missing from the API reference (add it to a page under docs/api/)", name,
                       type="fw", subtype="public-name")


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("env-check-consistency", check)
    return {"version": "1", "parallel_read_safe": True}
