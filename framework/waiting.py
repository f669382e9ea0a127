"""What this process is waiting in: the collectives that wait for every rank, named by what they
are for (the all-reduce of gradients, a metric sync, a barrier, a checkpoint save).

The places that start such a collective mark it: ``with waiting_in("a checkpoint save"):``. The
heartbeat (``trainer/heartbeat.py``) reads the marks from its own thread, so that a rank that has
waited too long says where; a collective that times out keeps its marks for the error message
(``failed_in``). A mark costs a list append and pop (a step makes a few).
"""

from __future__ import annotations

from typing import Any

_NOW: list[str] = []  # the main thread's marks, outermost first
_USER_CODE: set[str] = set()  # marks of the user's own code (training_step): no collective of fw's
_FAILED: list[tuple[str, ...]] = [()]  # the marks the last error left, innermost last
_INNERMOST = [False]  # the next mark to be left is the innermost one open (an error there is new)


class waiting_in:  # used as a context manager, like contextlib's
    """Marks the block as waiting in ``what`` (nested marks are read outermost first)."""

    __slots__ = ("what",)

    def __init__(self, what: str, user_code: bool = False) -> None:
        self.what = what
        if user_code:  # a rank here waits for nobody: the others may wait for it
            _USER_CODE.add(what)

    def __enter__(self) -> None:
        _NOW.append(self.what)
        _INNERMOST[0] = True

    def __exit__(self, kind: Any, *exc: Any) -> None:
        if kind is not None and _INNERMOST[0]:  # an error leaves its innermost mark first: the marks it left
            _FAILED[0] = tuple(_NOW)
        _INNERMOST[0] = kind is None  # the same error leaving the outer marks is not a new one
        _NOW.pop()


def now() -> str | None:
    """What the main thread waits in now ("a checkpoint save of 'x.ckpt': a gather"), or None."""
    marks = tuple(_NOW)  # a copy: the main thread changes the list meanwhile
    return ": ".join(marks) if marks else None


def in_user_code() -> bool:
    """Is the main thread in the user's own code (innermost mark), not in a collective?"""
    marks = tuple(_NOW)
    return bool(marks) and marks[-1] in _USER_CODE


def failed_in() -> str | None:
    """What the last error that left a mark (a collective's timeout) was waiting in, or None."""
    return ": ".join(_FAILED[0]) if _FAILED[0] else None
