"""What a fit costs once, part by part, on the clock: fw's fixed cost against the hand-written loop's.

``bench_fit.py --single --steps 1`` gives the whole difference of a one-step fit; this splits fw's
side of it. Each part below is wrapped where fw looks it up (a module attribute, or the loop the
Trainer runs), and the wrapper adds its own time on the clock to the part's total: a part's
figure includes the parts it calls (``_run_here`` holds most of the others). The fits are
``bench_fit.py``'s own (``raw_fit``, ``fw_fit``), one step each, one thread, pinned to a core;
the wrappers cost about 0.2 µs a call, counted in their parts. Under torchrun the fits run on
its ranks (2 Gloo ranks, each pinned to its core; a fit's time is the slowest rank's, the parts
are rank 0's, where a collective's part includes its wait for the other rank). ::

    .venv/bin/python benchmarks/bench_fit_fixed.py              # 400 fits a side
    .venv/bin/python benchmarks/bench_fit_fixed.py --fits 1000
    .venv/bin/python -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/bench_fit_fixed.py

Results: a table, and JSON under ``benchmarks/results/`` (``--out``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_fit  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from framework.bench.common import machine_info, print_table, result_path, write_json  # noqa: E402

#: (module, attribute path, what it is), in the order a fit reaches them
PARTS = [
    ("framework.trainer.trainer", "Trainer.__init__", "Trainer(...): settings, environment, strategy"),
    ("framework.trainer.trainer", "Trainer._run_here", "the call in this process (all below but Trainer())"),
    ("framework.trainer.setup", "new_run", "the Run, configure_callbacks, process settings"),
    ("framework.trainer.setup", "setup", "set-up: agreement, loggers, loaders, model to device, optimizers"),
    ("framework.strategies.base", "Strategy.setup_module", "  of which the module to its device"),
    ("framework.trainer.setup", "agreement.agree", "  of which the ranks' agreement (root folder check)"),
    ("framework.trainer.setup", "_loaders", "  of which the loaders (the global order's sampler)"),
    ("framework.trainer.setup", "note_differences", "  of which where fw differs from Lightning"),
    ("framework.trainer.checkpointing", "restore", "restore (nothing to restore here)"),
    ("framework.trainer.reports", "print_summary", "the run's first line (stderr)"),
    ("framework.trainer.trainer", "SignalCatcher.__enter__", "stop-signal handlers installed"),
    ("framework.trainer.trainer", "SignalCatcher.__exit__", "stop-signal handlers put back"),
    ("framework.trainer.trainer", "Heartbeat.__enter__", "heartbeat started (none in one process)"),
    ("framework.trainer.trainer", "Heartbeat.__exit__", "heartbeat stopped"),
    ("framework.trainer.trainer", "_LOOPS.fit", "the fit loop (with the one step)"),
    ("framework.trainer.preemption", "StopCheck.after_batch", "  the stop check after the batch (2 ranks: a collective)"),
    ("framework.trainer.preemption", "StopCheck.__call__", "  the stop check at the epoch's end (2 ranks: a collective)"),
    ("framework.loops.training_epoch", "_batch_step", "  the per-batch functions, built once an epoch (and a first zero_grad)"),
    ("framework.trainer.resume", "get_rng_state", "  RNG snapshots (the epoch's start; end of fit)"),
    ("framework.loops.training_epoch", "_end_train_epoch", "  the epoch's end (metrics, hooks)"),
    ("framework.trainer.metric_collector", "MetricCollector._adopt_entries_of_other_ranks",
     "    of which the ranks' metric entries compared (2 ranks: a collective)"),
    ("framework.trainer.reports", "report_where_it_went", "the run's last line (stderr)"),
    ("framework.trainer.setup", "teardown", "teardown: the fit's end state kept, hooks, loggers"),
    ("framework.trainer.setup", "end_of_fit.keep", "  of which every rank's states kept for a save after the fit"),
]


def wrap_parts(totals: dict[str, float]) -> None:
    """Each part replaced by a wrapper that adds its time to ``totals[part]`` (a part held in a
    dict, the Trainer's loops, is replaced in the dict)."""
    for module_name, path, _ in PARTS:
        key = f"{module_name}:{path}"
        bench_fit.replace_attribute(module_name, path, lambda original, key=key: _timed(original, totals, key))


def _timed(fn: Callable[..., Any], totals: dict[str, float], key: str) -> Callable[..., Any]:
    totals[key] = 0.0

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[key] += time.perf_counter() - start

    return timed


def per_fit(sides: dict[str, Callable[[], None]], fits: int, world: int) -> dict[str, float]:
    """Each side's mean time a call (the slowest rank's), the sides taking turns (machine noise
    lands on all)."""
    totals = dict.fromkeys(sides, 0.0)
    for _ in range(fits):
        for name, side in sides.items():
            totals[name] += bench_fit.timed(side, world)
    return {name: total / fits for name, total in totals.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fits", type=int, default=400)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = parser.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if world > 1 else 0
    os.sched_setaffinity(0, {rank % (os.cpu_count() or 1)})
    torch.set_num_threads(1)
    data, fresh = bench_fit.workload(1, world)
    raw = lambda: bench_fit.raw_fit(fresh(), data, 1, rank, world)  # noqa: E731
    fw = lambda: bench_fit.fw_fit(fresh(), data, 1, world)  # noqa: E731
    net_only = lambda: fresh()  # noqa: E731  # both sides build the network: its share of each
    sides = {"raw": raw, "fw": fw, "network": net_only}
    per_fit(sides, 20, world)  # warm-up
    bare = per_fit(sides, args.fits, world)
    totals: dict[str, float] = {}
    wrap_parts(totals)
    per_fit({"fw": fw}, 20, world)
    totals.update(dict.fromkeys(totals, 0.0))
    wrapped_fw = per_fit({"fw": fw}, args.fits, world)["fw"]
    if rank != 0:
        return
    parts = {key: value / args.fits for key, value in totals.items()}
    rows = [[what, f"{parts[f'{m}:{p}'] * 1e6:.1f}"] for m, p, what in PARTS]
    print_table(f"a one-step fit on {world} rank(s), {args.fits} fits a side: raw {bare['raw'] * 1e6:.0f} µs, fw {bare['fw'] * 1e6:.0f} µs "
                f"(fw - raw {(bare['fw'] - bare['raw']) * 1e6:.0f} µs; the network's building "
                f"{bare['network'] * 1e6:.0f} µs on both); fw's parts, wrapped ({wrapped_fw * 1e6:.0f} µs a fit)",
                ["part", "µs a fit"], rows)
    doc = {"machine": machine_info(), "world_size": world, "fits": args.fits, "per_fit_s": bare, "wrapped_fw_fit_s": wrapped_fw,
           "parts_s": {f"{m}:{p}": {"what": what.strip(), "s": parts[f"{m}:{p}"]} for m, p, what in PARTS}}
    path = write_json(result_path("fit_fixed" if world == 1 else f"fit_fixed_ddp{world}", out=Path(args.out)), doc)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
