"""The recipe's schema: typed dataclasses that OmegaConf checks a YAML file against.

``TrainerConfig`` is derived from ``Trainer.__init__``'s signature (names, defaults, types), so
a new Trainer argument is added in one place. A type OmegaConf can check (``int``, ``float``,
``bool``, ``str``, or one of them ``| None``) is kept; anything richer (``int | float | None``,
``Any``) becomes ``Any`` and the Trainer checks it. Types are checked here (``max_epochs: abc``
fails with the key's path); meanings (is this a known strategy?) are checked by the Trainer,
which raises ``ConfigError`` naming the key.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from dataclasses import dataclass, field
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


def _trainer_config() -> type:
    from framework.trainer import Trainer

    hints = typing.get_type_hints(Trainer.__init__)
    fields = [
        (name, _schema_type(hints.get(name, Any)), field(default=param.default))
        for name, param in inspect.signature(Trainer.__init__).parameters.items()
        if name != "self" and name not in _SECTIONS_OF_THEIR_OWN
    ]
    return dataclasses.make_dataclass(
        "TrainerConfig", fields, namespace={"__doc__": "The Trainer's keyword arguments; see framework.Trainer."}
    )


TrainerConfig = _trainer_config()


@dataclass
class RecipeConfig:
    """A whole recipe: what to build (``module``, ``data``, ``callbacks``, ``logger``, each
    ``_target_`` + keyword arguments) and how to run it (``trainer``, ``seed``, ``ckpt_path``)."""

    module: Any = None
    data: Any = None
    trainer: TrainerConfig = field(default_factory=TrainerConfig)  # type: ignore[valid-type]
    callbacks: Any = field(default_factory=list)
    logger: Any = True
    seed: Optional[int] = None
    ckpt_path: Optional[str] = None
