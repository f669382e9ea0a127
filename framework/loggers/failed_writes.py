"""A file logger whose folder cannot be written for a while (a full disk, a folder gone or
replaced, a network file system away): training goes on. One warning when a write first fails
(naming the logger, the path and the error), one line when writes work again, and at the end one
warning that counts what was never written."""

from __future__ import annotations

from framework.rank_zero import rank_zero_info, rank_zero_warn


class FailedWrites:
    """The bookkeeping of one logger (``who``): what waits, what was dropped, whether it said so."""

    def __init__(self, who: str, keep: int = 10_000) -> None:
        self.who, self.keep = who, keep
        self.dropped = 0
        self._failing = False

    @property
    def failing(self) -> bool:
        """Whether the last write failed."""
        return self._failing

    def failed(self, path: str, err: OSError, waiting: int, what: str) -> None:
        """A write of ``waiting`` ``what`` to ``path`` failed; they wait for the next try."""
        if not self._failing:
            self._failing = True
            rank_zero_warn(f"{self.who}: cannot write {path} ({type(err).__name__}: {err.strerror or err}); training "
                           f"goes on, and the {what} wait (up to {self.keep}) to be written when it can be")

    def worked(self, path: str, written: int, what: str) -> None:
        if self._failing:
            self._failing = False
            rank_zero_info(f"{self.who}: {path} can be written again; wrote the {written} {what} that waited")

    def report(self, path: str, left: int, what: str) -> None:
        """At the end: one warning counting what was never written (``left`` still waiting too)."""
        self.dropped += left
        if self.dropped:
            rank_zero_warn(f"{self.who}: not written to {path}: {self.dropped} {what}")
        self.dropped, self._failing = 0, False
