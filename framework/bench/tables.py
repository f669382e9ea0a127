"""The tables of ``fw bench`` (title, columns, rows of strings), for the Markdown report and the
terminal: training, GPU utilisation, DDP settings, collectives, ping-pong, fw_mpi against mpi4py."""

from __future__ import annotations

from framework.bench.labels import PART_LABELS, knobs_label, size_label
from framework.bench.results import mpi_ratios

Table = tuple[str, list[str], list[list[str]]]


def tables(train: list[dict], knobs: list[dict], comm: list[tuple[str, dict]]) -> list[Table]:
    out = []
    if train:
        rows = []
        for r in sorted(train, key=lambda r: (r["workload"], r["device"], r["precision"], r["world_size"], r["strategy"], r["side"])):
            fr = _fractions(r["parts_s"], r["step_s"])
            rows.append([r["workload"], r["strategy"] + ("" if r["precision"] == "32-true" else f" {r['precision']}"),
                         str(r["world_size"]), r["side"], f"{r['samples_per_s']:.0f}",
                         f"{r['spread_samples_per_s'][0]:.0f}-{r['spread_samples_per_s'][1]:.0f}",
                         _opt(r.get("scaling_efficiency"), "{:.2f}"), _opt(r.get("step_over_raw"), "{:.3f}"),
                         f"{r['param_MB_per_rank']:.1f}", f"{r['peak_memory_MB']:.0f}", f"{r['call_s']:.2f}", fr])  # fmt: skip
        out.append(("training: samples/s (median; spread: min-max over repeats, or IQR over steps with one repeat), "
                    "scaling (CPU: speed-up over one process on the same cores; GPU: efficiency against one GPU per process), "
                    "step time over the hand-written loop's, parameter MB each rank holds (its shards under fsdp), "
                    "peak resident memory of the process (CUDA: peak allocated)",
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
        backends = result["backends"]
        rows = []
        for size in result["sizes"]:
            for op in ("all_reduce", "broadcast", "all_gather", "reduce_scatter"):
                cells = {r["backend"]: r for r in result["collectives"] if r["bytes"] == size and r["op"] == op}
                if cells:
                    rows.append([size_label(size), op] + [
                        f"{_us(cells[b]['median_s'])} | {cells[b]['busbw_GBps']:.2f} | {cells[b]['fraction_of_memcpy']:.2f}"
                        if b in cells else "-" for b in backends])  # fmt: skip
        out.append((f"collectives on {job}: time | busbw GB/s | fraction of memcpy", ["size", "op", *backends], rows))
        ping = [[size_label(r["bytes"]), r["backend"], _us(r["latency_s"]), f"{r['bytes'] / r['latency_s'] / 1e9:.3f}"]
                for r in result["ping_pong"]]
        out.append((f"ping-pong on {job} (ranks 0 and 1)", ["size", "backend", "latency", "GB/s"], ping))
        ratios = mpi_ratios(result)
        if ratios:
            out.append((f"fw_mpi all-reduce / raw mpi4py on {job}", ["size", "ratio"], [[size_label(b), f"{x:.2f}"] for b, x in ratios]))
    return out


def _fractions(parts: dict, step: float) -> str:
    total = sum(parts.get(p, 0) for p in PART_LABELS) or step
    return "/".join(f"{parts.get(p, 0) / total * 100:.0f}" for p in PART_LABELS)


def _opt(value: float | None, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} µs" if seconds < 1e-3 else f"{seconds * 1e3:.2f} ms"
