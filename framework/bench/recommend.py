"""The recommendation of ``fw bench``: sentences, each derived from this run's numbers (the rows of
``results.py``): the fastest strategy per workload, the fastest backend for all-reduce by size,
fw's MPI group against raw mpi4py, whether fsdp pays off against DDP, and whether a DDP setting
beat the defaults.

None of them names a winner that the numbers do not separate (``trust.py``): candidates whose
spreads overlap are "not distinguishable here", a workload with a refused (implausible) value
gets no recommendation, and a run on a machine too busy to trust (``load.py``) says so first.
"""

from __future__ import annotations

from collections.abc import Sequence

from framework.bench.labels import knobs_label, on_device, size_label
from framework.bench.results import mpi_ratios
from framework.bench.trust import MIN_OVER_RAW, overlaps, ties

#: the DDP settings fw (and DDP) use unless told otherwise: the row the knobs are compared with
DEFAULT_KNOBS = {"bucket_cap_mb": 25}
NOT_APART = "not distinguishable here"


def recommendation(train: list[dict], knobs: list[dict], comm: list[tuple[str, dict]], busy: Sequence[str] = ()) -> list[str]:
    """Sentences, each derived from this run's numbers; ``busy``: why the machine was too busy
    to trust them (``load.busy_verdict``), said first."""
    out = []
    if busy:
        more = f" (and {len(busy) - 1} more)" if len(busy) > 1 else ""
        out.append(f"not trustworthy here ({busy[0]}{more}): the lines below are what this run measured; rerun on an "
                   "idle machine before acting on them")
    fw_rows = [r for r in train if r["side"] == "fw" and r["precision"] == "32-true"]
    out.extend(_strategies(train, fw_rows))
    out.extend(_fsdp_against_ddp(fw_rows))
    for job, result in comm:
        out.extend(_collectives(job, result))
    out.extend(_knobs(knobs))
    return out


def _spread(row: dict) -> str:
    low, high = row["spread_samples_per_s"]
    return f"{low:.0f}-{high:.0f}"


def _strategies(train: list[dict], fw_rows: list[dict]) -> list[str]:
    """Per workload: the fastest strategy, unless its spread overlaps another's or a value of the
    workload was refused."""
    out = []
    for workload in sorted({r["workload"] for r in fw_rows}):
        untrusted = [u for r in train if r["workload"] == workload for u in r.get("untrusted", [])]
        if untrusted:
            more = f" (and {len(untrusted) - 1} more)" if len(untrusted) > 1 else ""
            out.append(f"{workload}: no recommendation, the measurements are not trustworthy: {untrusted[0]}{more}")
            continue
        ranked = sorted((r for r in fw_rows if r["workload"] == workload), key=lambda r: -r["samples_per_s"])
        best, tied = ranked[0], ties(ranked, "spread_samples_per_s")
        if tied:
            names = ", ".join(f"`{r['strategy']}` x{r['world_size']}{on_device(r)} ({r['samples_per_s']:.0f}, spread "
                              f"{_spread(r)})" for r in [best, *tied])  # fmt: skip
            out.append(f"{workload}: {NOT_APART}: {names} samples/s: their spreads overlap, so this run does not say "
                       "which trains fastest")
            continue
        line = f"{workload}: train with `{best['strategy']}` on {best['world_size']} process(es){on_device(best)} ({best['samples_per_s']:.0f} samples/s"
        if len(ranked) > 1:
            nxt = ranked[1]
            line += (f"; {best['samples_per_s'] / nxt['samples_per_s']:.2f}x the next best, `{nxt['strategy']}` "
                     f"x{nxt['world_size']}{on_device(nxt)}; spreads {_spread(best)} and {_spread(nxt)} apart")
        out.append(line + ")")
    return out


def _collectives(job: str, result: dict) -> list[str]:
    """The fastest all-reduce backend by size (ties named together), and fw's MPI group against
    raw mpi4py (refused where fw's would be implausibly faster)."""
    out = []
    rows = [r for r in result["collectives"] if r["op"] == "all_reduce" and r["backend"] != "mpi4py"]
    winners = []
    for size in result["sizes"]:
        cells = sorted((r for r in rows if r["bytes"] == size), key=lambda r: r["median_s"])
        if cells:
            tied = [c["backend"] for c in cells[1:] if overlaps(c["iqr_s"], cells[0]["iqr_s"])]
            winners.append((size, " or ".join([cells[0]["backend"], *tied]) + (f" ({NOT_APART})" if tied else "")))
    if winners:
        out.append(f"all-reduce on {job}: " + "; ".join(f"{lo}-{hi}: {backend}" for lo, hi, backend in _spans(winners)))
    ratios = mpi_ratios(result)
    fast = [(b, x) for b, x in ratios if x < MIN_OVER_RAW]
    if fast:
        b, x = min(fast, key=lambda r: r[1])
        out.append(f"fw's MPI process group all-reduce vs raw mpi4py on {job}: not trustworthy, {x:.2f}x at {size_label(b)} "
                   f"is below {MIN_OVER_RAW:g} and fw's group runs mpi4py underneath")
    elif ratios:
        worst = max(ratios, key=lambda r: r[1])
        out.append(f"fw's MPI process group all-reduce vs raw mpi4py on {job}: at most {worst[1]:.2f}x (at {size_label(worst[0])})")
    return out


def _knobs(knobs: list[dict]) -> list[str]:
    """Per workload and job: a DDP setting only when its spread is apart from the default's."""
    out = []
    for workload, strategy, world, device in sorted({(r["workload"], r["strategy"], r["world_size"], r["device"]) for r in knobs}):
        rows = [r for r in knobs if (r["workload"], r["strategy"], r["world_size"], r["device"]) == (workload, strategy, world, device)]
        where = f"{workload} ({strategy} x{world}{on_device({'device': device})})"
        default = next((r for r in rows if r["ddp_kwargs"] == DEFAULT_KNOBS), None)
        best = min(rows, key=lambda r: r["step_s"])
        if default is None:
            continue
        gain = default["step_s"] / best["step_s"] - 1
        spreads = f"samples/s spreads {_spread(best)} and {_spread(default)}"
        if best is default:
            out.append(f"DDP settings for {where}: keep the defaults (bucket_cap_mb=25): no other setting was faster")
        elif overlaps(best["spread_samples_per_s"], default["spread_samples_per_s"]):
            out.append(f"DDP settings for {where}: keep the defaults (the best setting, {knobs_label(best)}, is "
                       f"{gain * 100:.1f}% faster, {NOT_APART}: {spreads} overlap)")
        else:
            out.append(f"DDP settings for {where}: {knobs_label(best)} ({gain * 100:.1f}% faster than the default, "
                       f"{spreads} apart)")
    return out


def _spans(winners: list[tuple[int, str]]) -> list[tuple[str, str, str]]:
    spans: list[list] = []
    for size, backend in winners:
        if spans and spans[-1][2] == backend:
            spans[-1][1] = size
        else:
            spans.append([size, size, backend])
    return [(size_label(lo), size_label(hi), b) for lo, hi, b in spans]


def _fsdp_against_ddp(fw_rows: list[dict]) -> list[str]:
    """Per workload trained under both: what fsdp saves per rank, what it costs in speed, and so
    when it pays off on this machine."""
    out = []
    for fsdp in (r for r in fw_rows if r["strategy"] == "fsdp"):
        ddp = next((r for r in fw_rows if r["workload"] == fsdp["workload"] and r["strategy"].startswith("ddp")
                    and r["world_size"] == fsdp["world_size"] and r["device"] == fsdp["device"]), None)
        if ddp is None or not ddp["param_MB_per_rank"] or "untrusted" in fsdp or "untrusted" in ddp:
            continue
        speed = fsdp["samples_per_s"] / ddp["samples_per_s"]
        head = (f"fsdp or DDP for {fsdp['workload']} (x{fsdp['world_size']}{on_device(fsdp)}): fsdp holds "
                f"{fsdp['param_MB_per_rank']:.1f} of DDP's {ddp['param_MB_per_rank']:.1f} MB of parameters per rank "
                f"(optimizer state and gradients shard alike) at {speed:.2f}x `{ddp['strategy']}`'s samples/s")
        if overlaps(fsdp["spread_samples_per_s"], ddp["spread_samples_per_s"]):
            tail = f"; as fast ({NOT_APART}: spreads {_spread(fsdp)} and {_spread(ddp)} overlap), so it pays off whenever memory counts"
        elif speed >= 1:
            tail = "; faster here, so it pays off whenever memory counts"
        else:
            tail = (f"; it pays off here only when the model and its optimizer state do not fit one device under DDP "
                    f"(it costs {(1 - speed) * 100:.0f}% of the speed)")
        out.append(head + tail)
    return out
