"""The one way code outside the Trainer's package swaps its parts: a tool that runs trials on the
user's Trainer (the Tuner, ``framework/tuner/aside.py``) lends it other settings, callbacks and
loggers for a trial and puts the user's back afterwards. Nothing else may be swapped."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from framework.trainer.trainer import Trainer

LENDABLE = ("settings", "callbacks", "loggers", "run", "last_fit", "batch_counts")


def lend_parts(trainer: Trainer, **parts: Any) -> None:
    """Set the named parts of ``trainer`` (only those in ``LENDABLE``)."""
    unknown = sorted(set(parts) - set(LENDABLE))
    if unknown:
        raise TypeError(f"lend_parts: {', '.join(unknown)} cannot be lent; only {', '.join(LENDABLE)}")
    for name, value in parts.items():
        setattr(trainer, name, value)
