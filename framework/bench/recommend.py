"""The recommendation of ``fw bench``: sentences, each derived from this run's numbers (the rows of
``results.py``): the fastest strategy per workload, the fastest backend for all-reduce by size,
fw's MPI group against raw mpi4py, and whether a DDP setting beat the defaults by more than the
run-to-run spread."""

from __future__ import annotations

from framework.bench.labels import knobs_label, on_device, size_label
from framework.bench.results import mpi_ratios

#: the DDP settings fw (and DDP) use unless told otherwise: the row the knobs are compared with
DEFAULT_KNOBS = {"bucket_cap_mb": 25}


def recommendation(train: list[dict], knobs: list[dict], comm: list[tuple[str, dict]]) -> list[str]:
    """Sentences, each derived from this run's numbers."""
    out = []
    fw_rows = [r for r in train if r["side"] == "fw" and r["precision"] == "32-true"]
    for workload in sorted({r["workload"] for r in fw_rows}):
        ranked = sorted((r for r in fw_rows if r["workload"] == workload), key=lambda r: -r["samples_per_s"])
        best = ranked[0]
        line = f"{workload}: train with `{best['strategy']}` on {best['world_size']} process(es){on_device(best)} ({best['samples_per_s']:.0f} samples/s"
        if len(ranked) > 1:
            nxt = ranked[1]
            line += f"; {best['samples_per_s'] / nxt['samples_per_s']:.2f}x the next best, `{nxt['strategy']}` x{nxt['world_size']}{on_device(nxt)}"
        out.append(line + ")")
    out.extend(_fsdp_against_ddp(fw_rows))
    for job, result in comm:
        rows = [r for r in result["collectives"] if r["op"] == "all_reduce" and r["backend"] != "mpi4py"]
        winners = []
        for size in result["sizes"]:
            cells = [r for r in rows if r["bytes"] == size]
            if cells:
                winners.append((size, min(cells, key=lambda r: r["median_s"])["backend"]))
        if winners:
            spans = _spans(winners)
            out.append(f"all-reduce on {job}: " + "; ".join(f"{lo}-{hi}: {backend}" for lo, hi, backend in spans))
        ratios = mpi_ratios(result)
        if ratios:
            worst = max(ratios, key=lambda r: r[1])
            out.append(f"fw's MPI process group all-reduce vs raw mpi4py on {job}: at most {worst[1]:.2f}x (at {size_label(worst[0])})")
    for workload, strategy, world, device in sorted({(r["workload"], r["strategy"], r["world_size"], r["device"]) for r in knobs}):
        rows = [r for r in knobs if (r["workload"], r["strategy"], r["world_size"], r["device"]) == (workload, strategy, world, device)]
        workload = f"{workload} ({strategy} x{world}{on_device({'device': device})})"
        default = next((r for r in rows if r["ddp_kwargs"] == DEFAULT_KNOBS), None)
        best = min(rows, key=lambda r: r["step_s"])
        if default is None:
            continue
        gain = default["step_s"] / best["step_s"] - 1
        low, high = default["step_iqr_s"]
        spread = (high - low) / default["step_s"]
        if best is default:
            out.append(f"DDP settings for {workload}: keep the defaults (bucket_cap_mb=25): no other setting was faster")
        elif gain <= spread:
            out.append(f"DDP settings for {workload}: keep the defaults (the best setting, {knobs_label(best)}, is "
                       f"{gain * 100:.1f}% faster, within the {spread * 100:.1f}% spread)")
        else:
            out.append(f"DDP settings for {workload}: {knobs_label(best)} ({gain * 100:.1f}% faster than the default, "
                       f"spread {spread * 100:.1f}%)")
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
        if ddp is None or not ddp["param_MB_per_rank"]:
            continue
        speed = fsdp["samples_per_s"] / ddp["samples_per_s"]
        as_fast = speed >= ddp["spread_samples_per_s"][0] / ddp["samples_per_s"]  # within DDP's spread
        head = (f"fsdp or DDP for {fsdp['workload']} (x{fsdp['world_size']}{on_device(fsdp)}): fsdp holds "
                f"{fsdp['param_MB_per_rank']:.1f} of DDP's {ddp['param_MB_per_rank']:.1f} MB of parameters per rank "
                f"(optimizer state and gradients shard alike) at {speed:.2f}x `{ddp['strategy']}`'s samples/s")
        out.append(head + ("; as fast within the spread here, so it pays off whenever memory counts" if as_fast else
                           f"; it pays off here only when the model and its optimizer state do not fit one device "
                           f"under DDP (it costs {(1 - speed) * 100:.0f}% of the speed)"))
    return out
