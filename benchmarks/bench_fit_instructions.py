"""The instructions of whole ``fit()`` calls against the hand-written loop's, counted by valgrind:
a measure that the machine's noise does not reach.

``bench_fit.py`` and ``bench_fsdp_step.py`` time whole fits; on a shared 2-core machine one
round's fw/raw ratio scatters by about 10 % (sd), so a median over 81 rounds still spans ±3 %,
wider than the 2 % to be shown. Here the same fits run on 2 Gloo ranks under torchrun, each rank
under callgrind, which counts every thread of the process (Gloo's, fw's heartbeat) and dumps its
counts at the edges of each timed call (``MARK``): each count is exactly one whole call, set-up
and teardown included. Each side runs once at a short and once at a long step count, after a
warm-up of both sides (imports, first calls); the difference gives the instructions of a step
and, subtracted, the fixed cost of a fit. Reported per rank: each side's instructions for the
long fit, per step and fixed, and fw over the hand-written side. fw's intervals set in seconds
(the stop check's, the heartbeat's) are stretched by the slowdown (``stretch_fw_clocks``).

Workloads: ``ddp`` is ``bench_fit.py``'s (MLP 64-512-512-10, 32 samples per rank per step,
Adam, DDP); ``single`` the same in one process (``bench_fit.py --single``, no launcher);
``fsdp`` is ``bench_fsdp_step.py``'s (its GPT, FSDP2 on each block and the root, AdamW, 8
sequences per rank per step).

Instructions are not time: a collective's wait for the other rank, or a cache miss, costs time
and few instructions. So this shows the work fw adds to a fit, and the timing benchmarks the
waits. ``--cache-sim`` also counts the misses of the first-level data cache and of the last-level
cache, as callgrind simulates them (it has no second level). ::

    .venv/bin/python benchmarks/bench_fit_instructions.py                   # ddp, 20 and 100 steps: 15 min
    .venv/bin/python benchmarks/bench_fit_instructions.py --workload fsdp   # 2 and 6 steps: an hour or more
    .venv/bin/python benchmarks/bench_fit_instructions.py --workload single # one process: 10 min
    .venv/bin/python benchmarks/bench_fit_instructions.py --workload single --cache-sim  # and cache misses: 20 min

FSDP is slow under callgrind: here the hand-written side's 4-step fit took 9 minutes (2.9 G
instructions), and its 12-step fit had not ended after 22 more; no fsdp run has been completed yet.

Needs ``valgrind`` (Debian: ``apt-get install valgrind``). Results: a table, and JSON under
``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
SIDES = ("raw", "fw")
STEPS = {"ddp": (20, 100), "fsdp": (2, 6), "single": (20, 100)}
#: the call that marks a timed call's edges: callgrind dumps its counts before each entry to it
#: (``os.getloadavg`` calls libc's ``getloadavg``; nothing else in a fit does)
MARK = "getloadavg"
FOLDER = "FW_CALLGRIND_DIR"  # where callgrind writes (the worker notes its pid there)
#: how much slower a fit runs under callgrind here (a 100-step ddp fit: 1 s -> 180 s)
SLOWDOWN = 180.0


def stretch_fw_clocks(slowdown: float) -> None:
    """fw's intervals set in seconds, stretched by the slowdown, so that under callgrind they
    fire as often per step as they do at full speed: the stop check's (``StopCheck.TARGET_S``:
    every 20 batches here, not every 2) and the heartbeat's (a beat every 5 s: once a fit, not 36
    times)."""
    from framework.trainer import heartbeat, preemption

    preemption.StopCheck.TARGET_S *= slowdown
    start = heartbeat.Heartbeat.__init__

    def stretched(self: heartbeat.Heartbeat, run: object) -> None:
        start(self, run)
        self.report_every *= slowdown
        self.beat_every *= slowdown

    heartbeat.Heartbeat.__init__ = stretched  # type: ignore[method-assign]


def ddp_sides(rank: int, world: int) -> dict[str, Callable[[int], None]]:
    import bench_fit as fits

    data, fresh = fits.workload(max(STEPS["ddp"]), world)
    return {"raw": lambda steps: fits.raw_fit(fresh(), data, steps, rank, world),
            "fw": lambda steps: fits.fw_fit(fresh(), data, steps, world)}


def fsdp_sides(rank: int, world: int) -> dict[str, Callable[[int], None]]:
    import logging

    import bench_fsdp_step as fsdp

    logging.getLogger("framework").setLevel(logging.WARNING)  # fw's start-up lines
    return {"raw": lambda steps: fsdp.hand_written(steps, 8), "fw": lambda steps: fsdp.with_fw(steps, 8)}


def worker(workload: str) -> None:
    """One rank: warm both sides up, then each side's short and long fit, each between two marks."""
    sys.path[:0] = [str(HERE), str(HERE.parent)]  # this tree's fw, not the installed one (an older tree beside it)
    import torch
    import torch.distributed as dist

    single = workload == "single"
    if not single:
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=3600))
    rank, world = (0, 1) if single else (dist.get_rank(), dist.get_world_size())
    (Path(os.environ[FOLDER]) / f"rank{rank}.pid").write_text(str(os.getpid()))  # callgrind's %p
    torch.set_num_threads(1)
    stretch_fw_clocks(SLOWDOWN)
    sides = (fsdp_sides if workload == "fsdp" else ddp_sides)(rank, world)
    for side in SIDES:
        sides[side](2)
    for side in SIDES:
        for steps in STEPS[workload]:
            if not single:
                dist.barrier()
            os.getloadavg()  # callgrind: the counts so far go to one file ...
            sides[side](steps)
            os.getloadavg()  # ... and this call's to the next
    if not single:
        dist.barrier()
        dist.destroy_process_group()


def counts(folder: Path, ranks: int, workload: str, events: tuple[str, ...] = ("Ir",)
           ) -> list[dict[str, dict[str, float]]]:
    """Per rank and side: the long fit's count of ``events`` summed (instructions: ``Ir``), a
    step's and the fixed cost, from callgrind's numbered dumps (the i-th timed call is dump
    ``2 i + 2``; the others hold what came before and between)."""
    short, long = STEPS[workload]
    out = []
    for rank in range(ranks):
        pid = (folder / f"rank{rank}.pid").read_text()
        dumps = (_totals(folder / f"cg.{pid}.out.{2 * i + 2}") for i in range(len(SIDES) * 2))
        calls = iter(sum(totals[event] for event in events) for totals in dumps)
        mine = {}
        for side in SIDES:
            a, b = next(calls), next(calls)
            step = (b - a) / (long - short)
            mine[side] = {"fit": b, "step": step, "fixed": b - step * long}
        out.append(mine)
    return out


@functools.cache  # each dump is read once, whichever events are asked of it
def _totals(path: Path) -> dict[str, int]:
    """A callgrind file's total of each event it counted (``Ir``; with ``--cache-sim`` also the
    first-level and last-level misses: ``D1mr``, ``DLmr``, ...)."""
    text = path.read_text()
    events = re.search(r"^events:\s*(.+)$", text, re.MULTILINE)
    totals = re.search(r"^(?:summary|totals):\s*([\d ]+)$", text, re.MULTILINE)
    if events is None or totals is None:
        raise SystemExit(f"{path}: no event totals in this callgrind file")
    names, values = events.group(1).split(), [int(v) for v in totals.group(1).split()]
    return dict(zip(names, values + [0] * (len(names) - len(values)), strict=True))  # trailing zeros are left out


#: with --cache-sim: callgrind's simulated misses (reads and writes) of the first-level data
#: cache and of the last-level cache, beside the instructions
MISSES = {"D1 misses": ("D1mr", "D1mw"), "LL misses": ("DLmr", "DLmw")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=tuple(STEPS), default="ddp")
    parser.add_argument("--cache-sim", action="store_true",
                        help="also count data-cache misses (callgrind --cache-sim=yes: about twice as slow)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=str(HERE / "results"))
    args = parser.parse_args()
    if args.worker:
        return worker(args.workload)
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    with tempfile.TemporaryDirectory(prefix="fw-callgrind-") as tmp:
        folder = Path(tmp)
        ranks = 1 if args.workload == "single" else 2
        launch = [] if ranks == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                        "--nproc-per-node", "2", "--no-python"]
        command = [*launch, "valgrind", "--tool=callgrind", f"--dump-before={MARK}",
                   *(["--cache-sim=yes"] if args.cache_sim else []),
                   f"--callgrind-out-file={folder}/cg.%p.out", sys.executable, __file__, "--worker",
                   "--workload", args.workload]
        env = {**os.environ, "PYTHONHASHSEED": "0", FOLDER: tmp}  # PYTHONHASHSEED: the same set orders each run
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"the callgrind run failed ({done.returncode}):\n{done.stderr[-4000:]}")
        per_rank = counts(folder, ranks, args.workload)
        misses = {name: counts(folder, ranks, args.workload, events)
                  for name, events in MISSES.items()} if args.cache_sim else {}
    report(per_rank, args, misses)


def report(per_rank: list[dict[str, dict[str, float]]], args: argparse.Namespace,
           misses: dict[str, list[dict[str, dict[str, float]]]]) -> None:
    sys.path.insert(0, str(HERE.parent))
    from framework.bench.common import machine_info, print_table, result_path, write_json

    short, long = STEPS[args.workload]
    for what, found_per_rank in {"instructions": per_rank, **misses}.items():
        unit, scale = ("G", 1e9) if what == "instructions" else ("M", 1e6)
        rows = []
        for rank, found in enumerate(found_per_rank):
            raw, fw = found["raw"], found["fw"]
            rows.append([f"rank {rank}", f"{raw['fit'] / scale:.4f} {unit}", f"{fw['fit'] / scale:.4f} {unit}",
                         f"{fw['fit'] / raw['fit']:.4f}", f"{raw['step'] / 1e3:.1f} k", f"{fw['step'] / 1e3:.1f} k",
                         f"{fw['step'] / raw['step']:.4f}", f"{raw['fixed'] / 1e3:.1f} k",
                         f"{fw['fixed'] / 1e3:.1f} k"])
        print_table(f"{args.workload}: whole fits on {len(per_rank)} rank(s), {what} (callgrind, every thread); "
                    f"a step and the fixed cost from the {short}- and {long}-step fits",
                    ["", f"raw {long}-step fit", f"fw {long}-step fit", "fw/raw", "raw step", "fw step", "fw/raw",
                     "raw fixed", "fw fixed"], rows)
    doc = {"machine": machine_info(), "workload": args.workload, "steps": [short, long], "instructions": per_rank,
           "fit_ratio": [found["fw"]["fit"] / found["raw"]["fit"] for found in per_rank],
           "step_ratio": [found["fw"]["step"] / found["raw"]["step"] for found in per_rank],
           **({"cache_misses": misses} if misses else {})}
    name = "fit_single_instructions" if len(per_rank) == 1 else f"fit_{args.workload}2_instructions"
    print(f"wrote {write_json(result_path(name + ('-cache' if misses else ''), out=Path(args.out)), doc)}")


if __name__ == "__main__":
    main()
