"""A Sphinx extension: the API reference shows what an argument annotated ``Any`` accepts.

Some of the Trainer's arguments take several kinds of value (``strategy``: a name, a mapping or a
``Strategy``) and are annotated ``Any`` in the code, whose signature is also the recipe schema's
source (``framework/config/schema.py``, which turns anything richer than ``int | None`` into
``Any`` anyway). A signature reading ``strategy: Any = 'auto'`` tells a reader nothing, so the
rendered signature shows the accepted types listed here instead; the docstring's ``Args:`` says
what each value means.

Each entry must still replace an ``Any``: when the code gives the argument a real annotation (or
drops it), the build warns (``-W`` fails it), and the entry here is to be removed or changed."""

from __future__ import annotations

import re
from typing import Any

from sphinx.application import Sphinx
from sphinx.util import logging

logger = logging.getLogger(__name__)

#: ``{class or function (module.qualname): {argument: what the signature shows in place of Any}}``
ACCEPTED: dict[str, dict[str, str]] = {
    "framework.trainer.trainer.Trainer": {
        "strategy": "str | dict | ~framework.strategies.Strategy",
        "devices": "int | str | list[int]",
        "precision": "str | int",
        "logger": "bool | ~framework.loggers.Logger | list[~framework.loggers.Logger] | None",
        "max_time": "float | str | dict[str, int] | None",
        "profiler": "str | ~framework.profilers.Profiler | None",
        "activation_checkpointing_policy": "Iterable[type[~torch.nn.Module] | str] | None",
        "compile": "bool | dict[str, Any]",
    },
}


def show_accepted(app: Sphinx, what: str, name: str, obj: Any, options: Any, signature: str | None,
                  return_annotation: str | None) -> tuple[str | None, str | None] | None:
    accepted = ACCEPTED.get(f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}")
    if not accepted or signature is None:
        return None
    for argument, types in accepted.items():
        signature, found = re.subn(rf"\b({argument}): (~?typing\.)?Any\b", rf"\1: {types}", signature)
        if not found:
            logger.warning("%s: argument %r is no longer annotated Any; update docs/_ext/accepted_types.py",
                           name, argument, type="fw", subtype="accepted-types")
    return signature, return_annotation


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("autodoc-process-signature", show_accepted)
    return {"version": "1", "parallel_read_safe": True}
