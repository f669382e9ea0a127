"""``SimpleProfiler``: the wall time of every action, as a table (Lightning's ``SimpleProfiler``).

Each row is one action: its mean duration, and with ``extended=True`` (the default) its number
of calls, total time and share of the time since the profiler was made; a ``Total`` row first.
Rows are sorted by share (extended) or by mean duration.
"""

from __future__ import annotations

import math
import os
import time
from collections import defaultdict
from pathlib import Path

from framework.profilers.profiler import Profiler


class SimpleProfiler(Profiler):
    """Records the duration of each action; reports mean, calls, total and percentage.

    Args:
        dirpath, filename: where the report goes (see ``Profiler``; default: the log).
        extended: add the columns number of calls, total time and percentage.

    Raises:
        ValueError: an action started again before it stopped, or stopped without a start.
    """

    def __init__(self, dirpath: str | Path | None = None, filename: str | None = None,
                 extended: bool = True) -> None:
        super().__init__(dirpath=dirpath, filename=filename)
        self.current_actions: dict[str, float] = {}
        self.recorded_durations: defaultdict[str, list[float]] = defaultdict(list)
        self.extended = extended
        self.start_time = time.perf_counter()

    def start(self, action_name: str) -> None:
        if action_name in self.current_actions:
            raise ValueError(f"Attempted to start {action_name} which has already started.")
        self.current_actions[action_name] = time.perf_counter()

    def stop(self, action_name: str) -> None:
        end = time.perf_counter()
        start = self.current_actions.pop(action_name, None)
        if start is None:
            raise ValueError(f"Attempting to stop recording an action ({action_name}) which was never started.")
        self.recorded_durations[action_name].append(end - start)

    def summary(self) -> str:
        sep = os.linesep
        title = (f"{self._stage.upper()} " if self._stage is not None else "") + f"Profiler Report{sep}"
        if not self.recorded_durations:
            return title
        width = max(len(action) for action in self.recorded_durations)
        columns: tuple[str, ...]
        if self.extended:
            columns = ("Mean duration (s)", "Num calls", "Total time (s)", "Percentage %")
            rows, total_calls, total_time = self._extended_rows()
            first = [("Total", "-", str(total_calls), f"{total_time:.5}", "100 %")]
        else:
            columns, rows, first = ("Mean duration (s)", "Total time (s)"), self._rows(), []
        header = _row(("Action", *columns), width)
        line = f"{sep}{'-' * len(header.expandtabs())}"
        table = title + line + header + line
        if first:
            table += "".join(_row(r, width) for r in first) + line
        return table + "".join(_row(r, width) for r in rows) + line + sep

    def _extended_rows(self) -> tuple[list[tuple[str, ...]], int, float]:
        """(action, mean, calls, total, percent) rows by share of the time, calls, elapsed."""
        elapsed = time.perf_counter() - self.start_time
        stats = []
        for action, durations in self.recorded_durations.items():
            total = math.fsum(durations)
            stats.append((action, total / len(durations), len(durations), total, 100.0 * total / elapsed))
        stats.sort(key=lambda s: s[4], reverse=True)
        rows: list[tuple[str, ...]] = [(a, f"{mean:.5}", str(n), f"{total:.5}", f"{share:.5}")
                                       for a, mean, n, total, share in stats]
        return rows, sum(s[2] for s in stats), elapsed

    def _rows(self) -> list[tuple[str, ...]]:
        """(action, mean, total) rows by mean duration."""
        stats = [(action, math.fsum(d) / len(d), math.fsum(d)) for action, d in self.recorded_durations.items()]
        stats.sort(key=lambda s: s[1], reverse=True)
        return [(a, f"{mean:.5}", f"{total:.5}") for a, mean, total in stats]


def _row(cells: tuple[str, ...], width: int) -> str:
    """``|  action<width>\\t|  cell<15>\\t|...`` on a new line: Lightning's table row."""
    action, *rest = cells
    return f"{os.linesep}|  {action:<{width}s}\t|" + "".join(f"  {cell:<15}\t|" for cell in rest)
