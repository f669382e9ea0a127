"""The tables of ``fw bench`` (title, columns, rows of strings), for the Markdown report and the
terminal: training, GPU utilisation, DDP settings, collectives, ping-pong, fw_mpi against mpi4py,
and the machine's load. Every row has one cell per column, and no cell holds a ``|``."""

from __future__ import annotations

from framework.bench.labels import knobs_label, size_label
from framework.bench.results import mpi_ratios, step_shares
from framework.bench.trust import MIN_OVER_RAW

Table = tuple[str, list[str], list[list[str]]]


def tables(train: list[dict], knobs: list[dict], comm: list[tuple[str, dict]]) -> list[Table]:
    out = []
    if train:
        rows = []
        for r in sorted(train, key=lambda r: (r["workload"], r["device"], r["precision"], r["world_size"], r["strategy"], r["side"])):
            fr = "/".join(f"{share * 100:.0f}" for share in step_shares(r).values())
            rows.append([r["workload"], r["strategy"] + ("" if r["precision"] == "32-true" else f" {r['precision']}"),
                         str(r["world_size"]), r["side"], f"{r['samples_per_s']:.0f}",
                         f"{r['spread_samples_per_s'][0]:.0f}-{r['spread_samples_per_s'][1]:.0f}",
                         _opt(r, "scaling_efficiency", "{:.2f}"), _opt(r, "step_over_raw", "{:.3f}"),
                         f"{r['param_MB_per_rank']:.1f}", f"{r['peak_memory_MB']:.0f}", f"{r['call_s']:.2f}", fr])  # fmt: skip
        out.append(("training: samples/s (median; spread: min-max over repeats, or IQR over steps with one repeat), "
                    "scaling (CPU: speed-up over one process on the same cores; GPU: efficiency against one GPU per process), "
                    "step time over the hand-written loop's, parameter MB each rank holds (its shards under fsdp), "
                    "peak resident memory of the process (CUDA: peak allocated); refused: a value physics rules out "
                    f"(a speed-up above the world size, a step below {MIN_OVER_RAW:g}x the loop's), not a measurement",
                    ["workload", "strategy", "world", "side", "samples/s", "spread", "scaling", "/raw", "params MB", "peak MB",
                     "call s", "step: data/fwd+bwd/opt/comm/other %"], rows))  # fmt: skip
    gpu = [r for r in train if "mfu" in r]
    if gpu:
        out.append(("GPU: model FLOPs utilisation of the GPT (bf16 peak of the data sheet)",
                    ["workload", "strategy", "precision", "side", "TFLOP/s", "MFU"],
                    [[r["workload"], r["strategy"], r["precision"], r["side"], f"{r['model_flops_per_s'] / 1e12:.1f}",
                      f"{r['mfu'] * 100:.1f}%"] for r in gpu]))  # fmt: skip
    if knobs:
        rows = [[r["workload"], f"{r['strategy']} x{r['world_size']}", knobs_label(r), f"{r['step_s'] * 1e3:.2f}", f"{r['samples_per_s']:.0f}",
                 f"{r['parts_s'].get('comm_unhidden', 0) * 1e3:.2f}", f"{r['parts_s'].get('comm_span', 0) * 1e3:.2f}"]
                for r in sorted(knobs, key=lambda r: (r["workload"], r["strategy"], r["world_size"], knobs_label(r)))]  # fmt: skip
        where = ", ".join(sorted({f"{r['strategy']} x{r['world_size']}" for r in knobs}))
        out.append((f"DDP settings (fw, {where}): step time, the all-reduce time backward did not hide, the all-reduce span",
                    ["workload", "strategy", "settings", "step ms", "samples/s", "comm unhidden ms", "comm span ms"], rows))
    for job, result in comm:
        out.append(_collectives(job, result))
        ping = [[size_label(r["bytes"]), r["backend"], _us(r["latency_s"]), f"{r['bytes'] / r['latency_s'] / 1e9:.3f}"]
                for r in result["ping_pong"]]
        out.append((f"ping-pong on {job} (ranks 0 and 1)", ["size", "backend", "latency", "GB/s"], ping))
        ratios = mpi_ratios(result)
        if ratios:
            out.append((f"fw_mpi all-reduce / raw mpi4py on {job} (refused: below {MIN_OVER_RAW:g}, which fw's group on "
                        "mpi4py cannot be)", ["size", "ratio"],
                        [[size_label(b), "refused" if x < MIN_OVER_RAW else f"{x:.2f}"] for b, x in ratios]))
    return out


def _collectives(job: str, result: dict) -> Table:
    """One row per size and collective; three columns per backend: median time, bus bandwidth
    and that as a fraction of the memory copy."""
    backends, rows = result["backends"], []
    for size in result["sizes"]:
        for op in ("all_reduce", "broadcast", "all_gather", "reduce_scatter"):
            cells = {r["backend"]: r for r in result["collectives"] if r["bytes"] == size and r["op"] == op}
            if not cells:
                continue
            row = [size_label(size), op]
            for b in backends:
                c = cells.get(b)
                row += [_us(c["median_s"]), f"{c['busbw_GBps']:.2f}", f"{c['fraction_of_memcpy']:.2f}"] if c else ["-"] * 3
            rows.append(row)
    columns = ["size", "op", *(f"{b} {what}" for b in backends for what in ("time", "busbw GB/s", "/memcpy"))]
    return (f"collectives on {job}: median time, bus bandwidth, its fraction of a memory copy's", columns, rows)


def load_table(load: dict) -> Table:
    """The machine's load before and during each job (``load.py``), as shares of the available cores' time."""
    rows = [["before", f"{load['before']['seconds']:.1f}", f"{load['before']['loadavg'][0]:.2f}",
             _pct(load["before"]["busy_share"]), _pct(load["before"]["others_share"])]]  # fmt: skip
    for name, job in load["jobs"].items():
        rows.append([name, f"{job['seconds']:.1f}", f"max {job['loadavg_max']:.2f}", _pct(job["busy_share"]),
                     _pct(job["others_share"])])
    d = load["during"]
    rows.append(["all jobs", f"{d['seconds']:.1f}", f"max {d['loadavg_max']:.2f}", _pct(d["busy_share"]), _pct(d["others_share"])])
    return (f"machine load on {load['cores']} available core(s): {load['rule']}",
            ["when", "seconds", "load average (1 min)", "busy", "other processes"], rows)


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{share * 100:.0f}%"


def _opt(row: dict, key: str, fmt: str) -> str:
    if key in row.get("refused", {}):
        return "refused"
    return "-" if row.get(key) is None else fmt.format(row[key])


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} µs" if seconds < 1e-3 else f"{seconds * 1e3:.2f} ms"
