"""The numbers of ``fw bench``'s report: every job's runs pooled into one row per setting, with
scaling, overhead over the hand-written loop and (GPU, bf16) model FLOPs utilisation (against
the peaks of ``ThroughputMonitor``'s table, ``callbacks/throughput.py``); the
all-reduce ratio of fw's MPI process group to raw mpi4py. A speed-up or ratio that cannot be
true is refused (``trust.py``).

A row pools the repeats of one (workload, strategy, world size, side, precision, DDP settings,
device); its step time is the median over every timed step of them.
"""

from __future__ import annotations

from collections import defaultdict

from framework.bench.common import iqr, median
from framework.bench.labels import PART_LABELS
from framework.bench.trust import refuse_implausible
from framework.callbacks.throughput import peak_flops


# -- the rows ---------------------------------------------------------------------------------
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
               "param_MB_per_rank": max(r.get("param_bytes_per_rank", 0) for r in runs) / 2**20,
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
            r["speedup"] = r["samples_per_s"] / base["samples_per_s"]
            r["scaling_efficiency"] = r["speedup"] / per_device
        raw = by_key.get((r["workload"], r["strategy"], r["world_size"], "raw", r["precision"], r["device"]))
        if raw and r["side"] != "raw":
            r["step_over_raw"] = r["step_s"] / raw["step_s"]
    for r in rows:  # a value physics rules out is refused, not reported (trust.py)
        refuse_implausible(r)
    return rows


def step_shares(row: dict) -> dict[str, float]:
    """Each part of ``row``'s step (``PART_LABELS``) as a fraction of the step."""
    parts = row["parts_s"]
    total = sum(parts.get(p, 0) for p in PART_LABELS) or row["step_s"]
    return {p: parts.get(p, 0) / total for p in PART_LABELS}


def comm_parts(parts: list[dict]) -> list[tuple[str, dict]]:
    return [(p["job"], p["comm"]) for p in parts if p.get("comm")]


def mpi_ratios(result: dict) -> list[tuple[int, float]]:
    """(bytes, fw_mpi time / raw mpi4py time) of all-reduce at each size."""
    cells = {(r["backend"], r["bytes"]): r["median_s"] for r in result["collectives"] if r["op"] == "all_reduce"}
    return [(b, cells[("fw_mpi", b)] / cells[("mpi4py", b)]) for b in result["sizes"] if ("fw_mpi", b) in cells and ("mpi4py", b) in cells]
