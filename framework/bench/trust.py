"""When ``fw bench``'s numbers may be acted on: two results whose spreads overlap are not
distinguishable, and a result that physics rules out is refused, not reported.

The rules, explicit so that a report can be checked against them:

* **Not distinguishable** (``overlaps``): the best and another candidate are a tie when their
  spreads overlap (training: min-max of samples/s over the repeats, or the IQR over the timed
  steps with one repeat; collectives: the IQR of the time over the iterations). The
  recommendation then names them together instead of a winner.
* **Implausible** (``implausible``): a speed-up over one process above the world size (N
  processes, each doing what the one process did on its share of the data, cannot be more
  than N times as fast), or a step time below ``MIN_OVER_RAW`` times the hand-written loop's
  that fw (or Lightning) wraps: it runs that loop plus its own hooks, so it cannot be much
  faster. Such a value says the measurement is noise (a busy machine during one of the runs), so
  it is taken out of the row (kept under ``refused``), the row is marked ``untrusted`` and no
  recommendation is drawn from its workload.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: fw's (or Lightning's) step time over the hand-written loop's below this is implausible
MIN_OVER_RAW = 0.8


def overlaps(a: Sequence[float], b: Sequence[float]) -> bool:
    """Whether the spreads ``a`` and ``b`` (low, high) share any value."""
    return a[0] <= b[1] and b[0] <= a[1]


def implausible(row: dict[str, Any]) -> dict[str, str]:
    """The values of ``row`` that cannot be a true measurement (``speedup``, ``step_over_raw``),
    each with why; empty: nothing physics rules out."""
    name = f"{row['workload']} {row['strategy']} x{row['world_size']} ({row['side']})"
    out = {}
    speedup, world = row.get("speedup"), row["world_size"]
    if speedup is not None and speedup > world:
        out["speedup"] = (f"{name}: a speed-up of {speedup:.2f} over one process is above the world size {world}, which "
                          f"{world} processes each doing one process's work cannot beat: the measurement is not trustworthy")
    ratio = row.get("step_over_raw")
    if ratio is not None and ratio < MIN_OVER_RAW:
        out["step_over_raw"] = (f"{name}: a step {ratio:.3f}x the hand-written loop's, which it wraps (below "
                                f"{MIN_OVER_RAW:g} is implausible): the measurement is not trustworthy")
    return out


def refuse_implausible(row: dict[str, Any]) -> None:
    """Take an implausible speed-up (and the scaling made from it) or ratio out of ``row``, kept
    under ``refused``, and say why under ``untrusted``."""
    found = implausible(row)
    if not found:
        return
    row["untrusted"] = list(found.values())
    keys = [*found, *(["scaling_efficiency"] if "speedup" in found else [])]
    row["refused"] = {key: row.pop(key) for key in keys if key in row}


def ties(ranked: list[dict[str, Any]], spread: str) -> list[dict[str, Any]]:
    """The candidates after the best (``ranked[0]``) whose ``spread`` overlaps the best's."""
    return [r for r in ranked[1:] if overlaps(r[spread], ranked[0][spread])]
