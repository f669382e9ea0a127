"""What fw keeps of a worker's failure, whichever way it reaches the caller (``ddp_spawn`` and
``ddp_notebook`` through pickled files, fw's launcher through the elastic agent's error file):
the traceback as text, the time it failed (to the microsecond), and the order that puts the first
failure first. The first one is what went wrong; the others are most often peers that met its
end, so each report leads with it.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class FailureStamp:
    """A worker's exception as it failed: its formatted traceback and when (``time.time()``)."""

    time: float
    traceback: str

    @classmethod
    def of(cls, err: BaseException) -> FailureStamp:
        """Stamp ``err`` now (in the worker, as it fails)."""
        return cls(time.time(), "".join(traceback.format_exception(err)))


def earliest_first(failures: Iterable[T], failed_at: Callable[[T], float]) -> list[T]:
    """``failures`` in the order they happened (``failed_at`` gives each one's time); ties keep
    their order."""
    return sorted(failures, key=failed_at)
