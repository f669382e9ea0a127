"""``every(n, count)``: the one rule behind every "every N" in fw (accumulation windows,
validation and logging intervals, scheduler frequencies, checkpoint intervals, reloads)."""

from __future__ import annotations


def every(n: int | None, count: int) -> bool:
    """Is ``count`` a multiple of ``n``: is the event counted by ``count`` (1 for the first
    batch, step or epoch done) one of every ``n``th? Never for ``n`` None or below 1."""
    return n is not None and n >= 1 and count % n == 0
