"""What ``fw bench`` writes and prints: one JSON with every sample, a Markdown report, PNG plots,
the tables on stdout, and a recommendation derived from this run's numbers.

Files, in ``--out`` (``<stem>`` is ``bench-<date>-<hardware>``): ``<stem>.json``, ``<stem>.md``,
``<stem>-comm.png`` (bus bandwidth against size, per collective and backend),
``<stem>-train.png`` (samples/s against world size, per workload and strategy) and
``<stem>-breakdown.png`` (where fw's step time goes, per workload and strategy; ``plots.py``).
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from framework.bench.common import cpu_tag, gpu_tag, iqr, machine_info, median, today, write_json

SCHEMA = 1
PART_LABELS = {"data_wait": "data wait", "forward_backward": "fwd+bwd", "optimizer": "optimizer",
               "comm_unhidden": "comm (unhidden)", "other": "other"}  # fmt: skip
DEFAULT_KNOBS = {"bucket_cap_mb": 25}
#: dense bf16 peak FLOP/s of one GPU (the vendors' data sheets), for MFU: the first pattern
#: that matches the device's name wins, so a variant comes before its family
PEAK_BF16 = (
    (r"\bMIG\b", None),  # a slice of a GPU: its share of the peak is not known here
    (r"\bH100\b.*\bPCIe\b", 756e12), (r"\bH100 NVL\b", 835e12), (r"\bH100\b", 989e12),
    (r"\bH200 NVL\b", 835e12), (r"\bG?H200\b", 989e12),
    (r"\bA100\b", 312e12), (r"\bL40S\b", 362e12), (r"\bL4\b", 121e12), (r"\bA10\b", 125e12),
)  # fmt: skip


def peak_for(name: str) -> float | None:
    """The bf16 peak of the GPU called ``name`` (as CUDA names it), None for one not in the table."""
    return next((peak for pattern, peak in PEAK_BF16 if re.search(pattern, name, re.IGNORECASE)), None)


def peak_flops(device: str) -> float | None:
    """The bf16 peak of the GPU this process sees, when it is in ``PEAK_BF16``."""
    import torch

    if not device.startswith("cuda") or not torch.cuda.is_available():
        return None
    return peak_for(torch.cuda.get_device_name(0))


def versions() -> dict[str, Any]:
    import platform

    import torch

    out: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__}
    for name in ("framework", "pytorch_lightning", "mpi4py", "numpy"):
        try:
            module = __import__(name)
            out["fw" if name == "framework" else name] = getattr(module, "__version__", "?")
        except ImportError:
            out[name] = None
    from framework.strategies.mpi_backend import mpi_library_version

    out["mpi_library"] = mpi_library_version()
    if torch.cuda.is_available():
        out["cuda"] = torch.version.cuda
        out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    return out


# -- the numbers ------------------------------------------------------------------------------
def train_rows(parts: list[dict], key: str = "train") -> list[dict]:
    """One row per (workload, strategy, world, side, precision, knobs), repeats pooled."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for part in parts:
        for run in (part.get(key) or {}).get("runs", []):
            knobs = tuple(sorted(run["ddp_kwargs"].items()))
            groups[(run["workload"], run["strategy"], run["world_size"], run["side"], run["precision"], knobs, run.get("device", "cpu"))].append(run)
    rows = []
    for (workload, strategy, world, side, precision, knobs, device), runs in groups.items():
        steps = [s for r in runs for s in r["samples_step_s"]]
        step = median(steps)
        batch = runs[0]["global_batch"]
        low, high = iqr(steps)
        parts_s = {p: median(r["parts_s"][p] for r in runs) for p in runs[0]["parts_s"]}
        row = {"workload": workload, "strategy": strategy, "world_size": world, "side": side, "precision": precision,
               "ddp_kwargs": dict(knobs), "device": device, "global_batch": batch, "step_s": step,
               "samples_per_s": batch / step, "samples_per_s_iqr": [batch / high, batch / low], "step_iqr_s": [low, high],
               "parts_s": parts_s, "peak_memory_MB": max(r["peak_memory_bytes"] for r in runs) / 2**20,
               "call_s": median(r["call_s"] for r in runs), "repeats": len(runs), "steps_timed": len(steps),
               "repeat_samples_per_s": [batch / r["step_s"] for r in runs]}  # fmt: skip
        # the spread shown: over the repeats when there are several, else over the timed steps
        per_repeat = row["repeat_samples_per_s"]
        row["spread_samples_per_s"] = [min(per_repeat), max(per_repeat)] if len(runs) > 1 else row["samples_per_s_iqr"]
        if "flops_per_sample" in runs[0]:
            row["model_flops_per_s"] = runs[0]["flops_per_sample"] * row["samples_per_s"]
            peak = peak_flops(device) if precision == "bf16-mixed" else None
            if peak:  # model FLOPs utilisation over the GPUs the run used (bf16 runs, bf16 peak)
                gpus = world if strategy != "dp" else __import__("torch").cuda.device_count()
                row["mfu"] = row["model_flops_per_s"] / (peak * gpus)
        rows.append(row)
    by_key = {(r["workload"], r["strategy"], r["world_size"], r["side"], r["precision"], r["device"]): r for r in rows if key == "train"}
    for r in rows:
        base = by_key.get((r["workload"], "single", 1, r["side"], r["precision"], r["device"]))
        if base and r["world_size"] > 1:
            # on GPUs each process adds a device: efficiency against n single devices; on a CPU the
            # processes share the cores one process had: the speed-up over that process
            per_device = 1 if r["device"] == "cpu" else r["world_size"]
            r["scaling_efficiency"] = r["samples_per_s"] / (per_device * base["samples_per_s"])
        raw = by_key.get((r["workload"], r["strategy"], r["world_size"], "raw", r["precision"], r["device"]))
        if raw and r["side"] != "raw":
            r["step_over_raw"] = r["step_s"] / raw["step_s"]
    return rows


def comm_parts(parts: list[dict]) -> list[tuple[str, dict]]:
    return [(p["job"], p["comm"]) for p in parts if p.get("comm")]


def recommendation(train: list[dict], knobs: list[dict], comm: list[tuple[str, dict]]) -> list[str]:
    """Sentences, each derived from this run's numbers."""
    out = []
    fw_rows = [r for r in train if r["side"] == "fw" and r["precision"] == "32-true"]
    for workload in sorted({r["workload"] for r in fw_rows}):
        ranked = sorted((r for r in fw_rows if r["workload"] == workload), key=lambda r: -r["samples_per_s"])
        best = ranked[0]
        line = f"{workload}: train with `{best['strategy']}` on {best['world_size']} process(es){_on(best)} ({best['samples_per_s']:.0f} samples/s"
        if len(ranked) > 1:
            nxt = ranked[1]
            line += f"; {best['samples_per_s'] / nxt['samples_per_s']:.2f}x the next best, `{nxt['strategy']}` x{nxt['world_size']}{_on(nxt)}"
        out.append(line + ")")
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
            out.append(f"fw's MPI process group all-reduce vs raw mpi4py on {job}: at most {worst[1]:.2f}x (at {_size(worst[0])})")
    for workload, strategy, world, device in sorted({(r["workload"], r["strategy"], r["world_size"], r["device"]) for r in knobs}):
        rows = [r for r in knobs if (r["workload"], r["strategy"], r["world_size"], r["device"]) == (workload, strategy, world, device)]
        workload = f"{workload} ({strategy} x{world}{_on({'device': device})})"
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
            out.append(f"DDP settings for {workload}: keep the defaults (the best setting, {_knobs(best)}, is "
                       f"{gain * 100:.1f}% faster, within the {spread * 100:.1f}% spread)")
        else:
            out.append(f"DDP settings for {workload}: {_knobs(best)} ({gain * 100:.1f}% faster than the default, "
                       f"spread {spread * 100:.1f}%)")
    return out


def _on(row: dict) -> str:
    return "" if row["device"] == "cpu" else " on CUDA"


def mpi_ratios(result: dict) -> list[tuple[int, float]]:
    """(bytes, fw_mpi time / raw mpi4py time) of all-reduce at each size."""
    cells = {(r["backend"], r["bytes"]): r["median_s"] for r in result["collectives"] if r["op"] == "all_reduce"}
    return [(b, cells[("fw_mpi", b)] / cells[("mpi4py", b)]) for b in result["sizes"] if ("fw_mpi", b) in cells and ("mpi4py", b) in cells]


def _spans(winners: list[tuple[int, str]]) -> list[tuple[str, str, str]]:
    spans: list[list] = []
    for size, backend in winners:
        if spans and spans[-1][2] == backend:
            spans[-1][1] = size
        else:
            spans.append([size, size, backend])
    return [(_size(lo), _size(hi), b) for lo, hi, b in spans]


def _size(nbytes: int) -> str:
    from framework.bench.comm import human_size

    return human_size(nbytes).replace(" ", "")


def _knobs(row: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(row["ddp_kwargs"].items())) or "defaults"


# -- tables -----------------------------------------------------------------------------------
def tables(train: list[dict], knobs: list[dict], comm: list[tuple[str, dict]]) -> list[tuple[str, list[str], list[list[str]]]]:
    out = []
    if train:
        rows = []
        for r in sorted(train, key=lambda r: (r["workload"], r["device"], r["precision"], r["world_size"], r["strategy"], r["side"])):
            fr = _fractions(r["parts_s"], r["step_s"])
            rows.append([r["workload"], r["strategy"] + ("" if r["precision"] == "32-true" else f" {r['precision']}"),
                         str(r["world_size"]), r["side"], f"{r['samples_per_s']:.0f}",
                         f"{r['spread_samples_per_s'][0]:.0f}-{r['spread_samples_per_s'][1]:.0f}",
                         _opt(r.get("scaling_efficiency"), "{:.2f}"), _opt(r.get("step_over_raw"), "{:.3f}"),
                         f"{r['peak_memory_MB']:.0f}", f"{r['call_s']:.2f}", fr])  # fmt: skip
        out.append(("training: samples/s (median; spread: min-max over repeats, or IQR over steps with one repeat), "
                    "scaling (CPU: speed-up over one process on the same cores; GPU: efficiency against one GPU per process), "
                    "step time over the hand-written loop's, peak resident memory of the process",
                    ["workload", "strategy", "world", "side", "samples/s", "spread", "scaling", "/raw", "RSS MB",
                     "call s", "step: data/fwd+bwd/opt/comm/other %"], rows))  # fmt: skip
    gpu = [r for r in train if "mfu" in r]
    if gpu:
        out.append(("GPU: model FLOPs utilisation of the GPT (bf16 peak of the data sheet)",
                    ["workload", "strategy", "precision", "side", "TFLOP/s", "MFU"],
                    [[r["workload"], r["strategy"], r["precision"], r["side"], f"{r['model_flops_per_s'] / 1e12:.1f}",
                      f"{r['mfu'] * 100:.1f}%"] for r in gpu]))  # fmt: skip
    if knobs:
        rows = [[r["workload"], f"{r['strategy']} x{r['world_size']}", _knobs(r), f"{r['step_s'] * 1e3:.2f}", f"{r['samples_per_s']:.0f}",
                 f"{r['parts_s'].get('comm_unhidden', 0) * 1e3:.2f}", f"{r['parts_s'].get('comm_span', 0) * 1e3:.2f}"]
                for r in sorted(knobs, key=lambda r: (r["workload"], r["strategy"], r["world_size"], _knobs(r)))]  # fmt: skip
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
                    rows.append([_size(size), op] + [
                        f"{_us(cells[b]['median_s'])} | {cells[b]['busbw_GBps']:.2f} | {cells[b]['fraction_of_memcpy']:.2f}"
                        if b in cells else "-" for b in backends])  # fmt: skip
        out.append((f"collectives on {job}: time | busbw GB/s | fraction of memcpy", ["size", "op", *backends], rows))
        ping = [[_size(r["bytes"]), r["backend"], _us(r["latency_s"]), f"{r['bytes'] / r['latency_s'] / 1e9:.3f}"]
                for r in result["ping_pong"]]
        out.append((f"ping-pong on {job} (ranks 0 and 1)", ["size", "backend", "latency", "GB/s"], ping))
        ratios = mpi_ratios(result)
        if ratios:
            out.append((f"fw_mpi all-reduce / raw mpi4py on {job}", ["size", "ratio"], [[_size(b), f"{x:.2f}"] for b, x in ratios]))
    return out


def _fractions(parts: dict, step: float) -> str:
    total = sum(parts.get(p, 0) for p in PART_LABELS) or step
    return "/".join(f"{parts.get(p, 0) / total * 100:.0f}" for p in PART_LABELS)


def _opt(value, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} µs" if seconds < 1e-3 else f"{seconds * 1e3:.2f} ms"


def markdown(doc: dict, tabs) -> str:
    m = doc["machine"]
    lines = [f"# fw bench, {m['hardware']}, {m['date']}", "",
             f"{m['cpu_count']} cores, torch {doc['versions']['torch']}, MPI: {doc['versions'].get('mpi_library') or 'none'}, "
             f"Lightning: {doc['versions'].get('pytorch_lightning') or 'not installed'}; "
             f"{'quick' if doc['quick'] else 'full'} run, {doc['wall_s']:.0f} s. Medians after warm-up; spread: min-max over "
             "repeats (training), IQR over iterations (collectives).", "",
             "## Recommendation", "", *[f"- {line}" for line in doc["recommendation"]], ""]  # fmt: skip
    for note in doc["notes"]:
        lines.append(f"> {note}\n")
    for title, columns, rows in tabs:
        lines += [f"## {title}", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        lines.append("")
    lines += ["## Jobs", "", "| job | status | wall s |", "|---|---|---|"]
    lines += [f"| {r['name']} | {r['status']} | {r['wall_s']:.1f} |" for r in doc["jobs"]]
    if doc.get("plots"):
        lines += ["", "## Plots", "", *[f"![{p}]({p})" for p in doc["plots"]]]
    return "\n".join(lines) + "\n"


# -- the whole report -------------------------------------------------------------------------
def write_report(parts: list[dict], records: list[dict], args: argparse.Namespace, notes: list[str], wall_s: float) -> Path:
    import torch

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    hw = gpu_tag() if device == "cuda" else cpu_tag()
    stem = out / f"bench-{today()}-{hw}"
    train, knobs, comm = train_rows(parts), train_rows(parts, "knobs"), comm_parts(parts)
    for note in (f"Lightning: {p['train']['lightning']}" for p in parts if p.get("train") and p["train"]["lightning"] != "ran"):
        if note not in notes:
            notes.append(note)
    doc = {
        "schema": SCHEMA, "benchmark": "fw bench", "quick": bool(args.quick), "suite": args.suite,
        "machine": machine_info(device), "versions": versions(), "wall_s": wall_s, "jobs": records,
        "notes": notes, "recommendation": recommendation(train, knobs, comm),
        "train": train, "knobs": knobs, "parts": parts,
    }  # fmt: skip
    tabs = tables(train, knobs, comm)
    try:
        from framework.bench.plots import plots

        doc["plots"] = plots(stem, train, comm)
    except ImportError as err:
        doc["plots"] = []
        notes.append(f"no plots: {err} (pip install 'fw[bench]')")
    json_path = write_json(stem.with_suffix(".json"), doc)
    md_path = stem.with_suffix(".md")
    md_path.write_text(markdown(doc, tabs))
    show(tabs, doc, [json_path, md_path, *(out / p for p in doc["plots"])])
    return json_path


def show(tabs, doc: dict, files: list[Path]) -> None:
    """The tables, the files and the recommendation, on stdout."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(170, Console().width))
    for title, columns, rows in tabs:
        table = Table(title=title)
        for i, col in enumerate(columns):
            table.add_column(col, justify="left" if i < 2 else "right")
        for row in rows:
            table.add_row(*row)
        console.print(table)
    for note in doc["notes"]:
        console.print(f"note: {note}", markup=False)
    console.print("files: " + ", ".join(str(f) for f in files), markup=False)
    console.print("recommendation (from this run):")
    for line in doc["recommendation"]:
        console.print(f"  - {line}", markup=False)
