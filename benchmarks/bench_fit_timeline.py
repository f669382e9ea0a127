"""Where each rank is at a fit's start and end, on one clock: does a rank wait for the other?

``bench_fit_fixed.py`` names fw's parts of a fit's fixed cost on rank 0, where a collective's part
includes any wait for the other rank. Here both ranks stamp the same points of the same fits with
``time.perf_counter`` (CLOCK_MONOTONIC, which every process of the machine shares), so the two
timelines line up: a blocking collective that both ranks enter together costs its own time, one
that a rank enters late shows the other rank's wait. The points are wrapped where fw looks them up
(a wrapper costs about 0.2 µs), in ``bench_fit.py``'s fits (100 steps, MLP 64-512-512-10, each rank
pinned to its core); the hand-written loop's fits give its own start and end. Reported: the median
over fits of each point's time relative to rank 0's last optimizer step, per rank and side. ::

    .venv/bin/python -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/bench_fit_timeline.py

Results: a table, and JSON under ``benchmarks/results/`` (``--out``).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_fit  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from framework.bench.common import machine_info, print_table, result_path, write_json  # noqa: E402
from framework.strategies.distributed import destroy_process_groups  # noqa: E402

#: (module, attribute path, label), in the order a fit reaches them
POINTS = [
    ("torch.nn.parallel", "DistributedDataParallel.forward", "step's forward"),
    ("torch.optim", "Adam.step", "optimizer step"),
    ("framework.loops.training_epoch", "_end_train_epoch", "epoch end"),
    ("framework.trainer.metric_collector", "MetricCollector.compute_epoch", "metric entries compared"),
    ("framework.trainer.preemption", "StopCheck.__call__", "epoch end's stop check"),
    ("framework.trainer.heartbeat", "Heartbeat.__exit__", "heartbeat stopped"),
    ("framework.trainer.reports", "report_where_it_went", "last line"),
    ("framework.trainer.end_of_fit", "keep", "per-rank states kept"),
    ("framework.trainer.setup", "teardown", "teardown"),
]
STAMPS: list[tuple[str, float]] = []


def stamp_calls() -> None:
    """Stamp the entry (``>``) and exit (``<``) of every point on this process's clock."""
    for module_name, path, label in POINTS:
        bench_fit.replace_attribute(module_name, path, functools.partial(_stamped, label=label))


def _stamped(fn, label: str):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        STAMPS.append((label + " >", time.perf_counter()))
        try:
            return fn(*args, **kwargs)
        finally:
            STAMPS.append((label + " <", time.perf_counter()))
    return wrapper


def timeline(stamps: list[tuple[str, float]], reference: float) -> dict[str, float]:
    """Milliseconds from ``reference`` to the call, the first forward, and each other point's
    first stamp (the first of the epoch end's two metric passes is the one that compares)."""
    points = {"call": stamps[0][1], "first forward": next(t for label, t in stamps if label == "step's forward >"),
              "last optimizer step <": [t for label, t in stamps if label == "optimizer step <"][-1]}
    for label, t in stamps[1:]:
        if not label.startswith(("step's forward", "optimizer step")):
            points.setdefault(label, t)
    return {label: (t - reference) * 1e3 for label, t in points.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fits", type=int, default=40, help="fits a side (the first 6 of each are warm-up)")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    os.sched_setaffinity(0, {rank % (os.cpu_count() or 1)})
    torch.set_num_threads(1)
    stamp_calls()
    data, fresh = bench_fit.workload(args.steps, world)
    sides = {"raw": lambda: bench_fit.raw_fit(fresh(), data, args.steps, rank, world),
             "fw": lambda: bench_fit.fw_fit(fresh(), data, args.steps, world)}
    found: dict[str, list[list[dict[str, float]]]] = {side: [] for side in sides}
    for fit in range(2 * args.fits):
        side = "fw" if fit % 2 == 0 else "raw"
        STAMPS.clear()
        dist.barrier()
        STAMPS.append(("call", time.perf_counter()))
        sides[side]()
        STAMPS.append(("returned", time.perf_counter()))
        every_rank: list = [None] * world
        dist.all_gather_object(every_rank, list(STAMPS))
        if fit >= 12:
            last_step = [t for label, t in every_rank[0] if label == "optimizer step <"][-1]
            found[side].append([timeline(stamps, last_step) for stamps in every_rank])
    if rank == 0:
        report(found, args, world)
    destroy_process_groups()  # with a barrier and a settle: Gloo's threads abort a bare exit


def report(found: dict[str, list[list[dict[str, float]]]], args: argparse.Namespace, world: int) -> None:
    rows, result = [], {}
    for side, fits in found.items():
        for r in range(world):
            labels = [label for label in fits[0][r] if all(label in fit[r] for fit in fits)]
            medians = {label: statistics.median(fit[r][label] for fit in fits) for label in labels}
            result[f"{side} rank {r}"] = medians
            rows += [[side, str(r), label, f"{ms:+.2f}"] for label, ms in medians.items()]
    print_table(f"{args.steps}-step fits on {world} ranks: ms from rank 0's last optimizer step (median of "
                f"{len(found['fw'])} fits a side)", ["side", "rank", "point", "ms"], rows)
    path = write_json(result_path(f"fit_timeline_ddp{world}", out=Path(args.out)),
                      {**machine_info(), "steps": args.steps, "fits": len(found["fw"]), "timelines": result})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
