"""The recipe's schema: typed dataclasses that OmegaConf checks a YAML file against.

``TrainerConfig`` is derived from ``Trainer.__init__``'s signature (names, defaults, types), so
a new Trainer argument is added in one place; both dataclasses are built on first use (reading
that signature loads the Trainer: importing the schema does not). A type OmegaConf can check (``int``, ``float``,
``bool``, ``str``, or one of them ``| None``) is kept; anything richer (``int | float | None``,
``Any``) becomes ``Any`` and the Trainer checks it. Types are checked here (``max_epochs: abc``
fails with the key's path); meanings (is this a known strategy?) are checked by the Trainer,
which raises ``ConfigError`` naming the key.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from dataclasses import field
from typing import Any, Optional

#: Trainer arguments that are recipe sections of their own (built from ``_target_``).
_SECTIONS_OF_THEIR_OWN = ("callbacks", "logger")
_PLAIN = (int, float, bool, str)


def _schema_type(annotation: Any) -> Any:
    if annotation in _PLAIN:
        return annotation
    args = typing.get_args(annotation)
    if type(None) in args:
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and rest[0] in _PLAIN:
            return Optional[rest[0]]
    return Any


@functools.cache
def trainer_config() -> type:
    """``TrainerConfig``: the Trainer's keyword arguments, with the types OmegaConf can check."""
    from framework.trainer import Trainer

    hints = typing.get_type_hints(Trainer.__init__)
    fields = [
        (name, _schema_type(hints.get(name, Any)), field(default=param.default))
        for name, param in inspect.signature(Trainer.__init__).parameters.items()
        if name != "self" and name not in _SECTIONS_OF_THEIR_OWN
    ]
    return dataclasses.make_dataclass(
        "TrainerConfig", fields, namespace={"__doc__": "The Trainer's keyword arguments; see framework.Trainer.", "__module__": __name__}
    )


@functools.cache
def recipe_config() -> type:
    """``RecipeConfig``: a whole recipe: what to build (``module``, ``data``, ``callbacks``,
    ``logger``, each ``_target_`` + keyword arguments) and how to run it (``trainer``, ``seed``,
    ``ckpt_path``)."""
    trainer = trainer_config()
    return dataclasses.make_dataclass("RecipeConfig", [
        ("module", Any, field(default=None)),
        ("data", Any, field(default=None)),
        ("trainer", trainer, field(default_factory=trainer)),
        ("callbacks", Any, field(default_factory=list)),
        ("logger", Any, field(default=True)),
        ("seed", Optional[int], field(default=None)),
        ("ckpt_path", Optional[str], field(default=None)),
    ], namespace={"__doc__": recipe_config.__doc__, "__module__": __name__})


def __getattr__(name: str) -> Any:
    """``TrainerConfig`` and ``RecipeConfig`` as names of this module, built on first use."""
    if name == "TrainerConfig":
        return trainer_config()
    if name == "RecipeConfig":
        return recipe_config()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
