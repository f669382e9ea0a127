"""Counting batches under a limit, and knowing which batch is the last."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from typing import Any

from framework.errors import ConfigError


def num_batches(loader, limit: int | float | None) -> float:
    """Batches to run: the loader's length (``inf`` without one), cut by ``limit`` (a count, or
    a fraction of the length)."""
    total: int | float
    try:
        total = len(loader)
    except TypeError:
        total = math.inf
    if limit is None:
        return total
    if isinstance(limit, float):
        return math.inf if math.isinf(total) else int(total * limit)
    return min(total, limit)


#: each stage's ``limit_*_batches`` argument
LIMIT_ARGUMENTS = {"train": "limit_train_batches", "validate": "limit_val_batches", "test": "limit_test_batches",
                   "predict": "limit_predict_batches"}


def refuse_a_fraction_of_no_batch(loader: Any, limit: int | float | None, stage: str) -> None:
    """A fraction of a loader that leaves no batch (0.1 of 4) is refused, as Lightning refuses it,
    rather than run as a stage of no batches (0, the int, still turns the stage off)."""
    if not isinstance(limit, float) or limit <= 0:
        return
    total = num_batches(loader, None)
    if math.isinf(total) or total == 0 or int(total * limit) > 0:
        return
    raise ConfigError(f"trainer.{LIMIT_ARGUMENTS[stage]}={limit} of {int(total)} batches leaves no batch: give at least "
                      f"{1 / total:.4g} (one batch), a number of batches (an int), or 0 to skip the stage")


class LookAhead:
    """An iterator that knows, after each item, whether it was the last (``.last``): a loader
    without a length must still end its last gradient-accumulation group with a step."""

    _END = object()

    def __init__(self, iterator: Iterator[Any]) -> None:
        self._iterator, self.last = iterator, False
        self._next = next(iterator, self._END)

    def __iter__(self) -> LookAhead:
        return self

    def __next__(self) -> Any:
        item = self._next
        if item is self._END:
            raise StopIteration
        self._next = next(self._iterator, self._END)
        self.last = self._next is self._END
        return item


def up_to(iterator: Iterator[Any], count: float) -> Iterator[Any]:
    """The first ``count`` items of ``iterator`` (all for ``inf``), never reading one more: a
    batch read past a limit draws what a random transform draws, and Lightning reads none."""
    return iterator if math.isinf(count) else itertools.islice(iterator, max(0, int(count)))
