"""Where a one-process fit's extra time goes, phase by phase, fw against the hand-written loop.

``bench_fit.py --single`` times whole calls; this splits each step of the same fits (its
``raw_fit`` and ``fw_fit``, unchanged) at the same points on both sides, with the same global
hooks (so their own cost lands on both): the network's forward pre- and post-hooks, every
optimizer's step pre- and post-hooks, and the data loader iterator's ``__next__``. Per step:

- ``forward``: the network's forward;
- ``backward``: from the forward's end to the optimizer step (the loss, its backward, and fw's
  closure around them);
- ``optimizer``: the optimizer's step;
- ``after step``: from the step's end to the next batch's fetch (``zero_grad``, and fw's
  bookkeeping after a batch: step count, stop check);
- ``fetch``: the loader's ``__next__``;
- ``before forward``: from the fetch to the forward (fw: the batch's closure, ``training_step``).

Each phase is summed over a fit's steps after the first; the table gives medians over rounds and
the median of the paired ratios, and besides the steps the fit's two ends: from the call to the
first forward (set-up, the first fetch) and from the last optimizer step to the return (the
epoch's end, teardown). Below the table, the steps whose extra time (fw's median minus the
loop's, in the phases where fw's own code runs: after the step and before the forward) stands
out: where a collective of fw's own starts or is read. Under torchrun the fits run on its ranks (Gloo, each rank pinned
to its core) and the phases are rank 0's: its backward includes the wait for the other rank's
gradients. ::

    .venv/bin/python benchmarks/bench_fit_phases.py                    # MLP 64-512-512-10, 100 steps
    .venv/bin/python benchmarks/bench_fit_phases.py --sizes 8,4 --steps 300   # the glue alone
    .venv/bin/python -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/bench_fit_phases.py
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_fit  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.utils.data.dataloader as dataloader  # noqa: E402
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook  # noqa: E402

from framework.bench.common import machine_info, median, print_table, result_path, write_json  # noqa: E402

#: a step's marks, from its forward's start to the next one's, and each phase as a pair of them
STEP = ["f0", "f1", "s0", "s1", "n0", "n1", "f0"]
PHASES = {"forward": (0, 1), "backward": (1, 2), "optimizer": (2, 3), "after step": (3, 4), "fetch": (4, 5),
          "before forward": (5, 6)}
ENDS = ("call to first forward", "last step to return")
OWN = ("after step", "before forward")  # where fw's code between the tensor work runs


class Marks:
    """Timestamps of one fit's events, in order; ``phases()`` sums each phase over its steps."""

    current: Marks | None = None  # the fit running (``measured``): the hooks below mark into it

    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []

    def phases(self) -> tuple[dict[str, float], list[float]]:
        """Seconds in each phase over the steps after the first (a step: ``STEP``'s marks in order;
        the first forward has no fetch before it), and at the fit's two ends (``measured``'s
        "call" and "return" marks); and each of those steps' seconds in fw's own phases (after
        the step, before the forward), in order."""
        names = [name for name, _ in self.events]
        totals = dict.fromkeys(PHASES, 0)
        steps = []
        for i in range(len(names) - len(STEP) + 1):
            if names[i:i + len(STEP)] == STEP:
                times = [t for _, t in self.events[i:i + len(STEP)]]
                for phase, (start, end) in PHASES.items():
                    totals[phase] += times[end] - times[start]
                steps.append(sum(times[PHASES[p][1]] - times[PHASES[p][0]] for p in OWN) / 1e9)
        first_forward = next(t for name, t in self.events if name == "f0")
        last_step = next(t for name, t in reversed(self.events) if name == "s1")
        totals[ENDS[0]] = first_forward - self.events[0][1]
        totals[ENDS[1]] = self.events[-1][1] - last_step
        return {phase: ns / 1e9 for phase, ns in totals.items()}, steps


def _mark(name: str) -> None:
    if Marks.current is not None:
        Marks.current.events.append((name, time.perf_counter_ns()))


def install_marks() -> None:
    """Global hooks, so that both sides run ``bench_fit``'s own fits unchanged: the network's
    forward (the ``nn.Sequential``, not its layers), every optimizer's step, every loader's fetch."""
    def forward(mark: str):
        return lambda module, *_: _mark(mark) if isinstance(module, torch.nn.Sequential) else None

    torch.nn.modules.module.register_module_forward_pre_hook(forward("f0"))
    torch.nn.modules.module.register_module_forward_hook(forward("f1"))
    register_optimizer_step_pre_hook(lambda *_: _mark("s0"))
    register_optimizer_step_post_hook(lambda *_: _mark("s1"))
    fetch = dataloader._BaseDataLoaderIter.__next__

    def __next__(self):
        _mark("n0")
        try:
            return fetch(self)
        finally:
            _mark("n1")

    dataloader._BaseDataLoaderIter.__next__ = __next__


def measured(fit) -> tuple[dict[str, float], list[float]]:
    Marks.current = marks = Marks()
    try:
        _mark("call")
        fit()
        _mark("return")
    finally:
        Marks.current = None
    return marks.phases()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--sizes", default=",".join(map(str, bench_fit.SIZES)), help="the MLP's widths")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = parser.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
        os.sched_setaffinity(0, {dist.get_rank() % (os.cpu_count() or 1)})
    rank = dist.get_rank() if world > 1 else 0
    torch.set_num_threads(1)
    bench_fit.SIZES = tuple(int(w) for w in args.sizes.split(","))
    install_marks()
    data, fresh = bench_fit.workload(args.steps, world)
    sides = {"raw": lambda: measured(lambda: bench_fit.raw_fit(fresh(), data, args.steps, rank, world)),
             "fw": lambda: measured(lambda: bench_fit.fw_fit(fresh(), data, args.steps, world))}
    for side in sides.values():  # warm-up
        side()
    phases: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
    steps: dict[str, list[list[float]]] = {name: [] for name in sides}
    wall: dict[str, list[float]] = {name: [] for name in sides}
    for r in range(args.rounds):
        for name in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
            if world > 1:
                dist.barrier()
            start = time.perf_counter()
            fit_phases, fit_steps = sides[name]()
            wall[name].append(time.perf_counter() - start)
            phases[name].append(fit_phases)
            steps[name].append(fit_steps)
    if rank != 0:
        return
    samples = {side: {**{phase: [p[phase] for p in phases[side]] for phase in [*PHASES, *ENDS]},
                      "whole fit": wall[side]} for side in sides}
    rows = []
    for phase in [*PHASES, *ENDS, "whole fit"]:
        raw, ours = samples["raw"][phase], samples["fw"][phase]
        rows.append({"phase": phase, "raw_s": median(raw), "fw_s": median(ours),
                     "paired_ratio": median([b / a for a, b in zip(raw, ours, strict=True)]),
                     "fw_minus_raw_us_per_step": (median(ours) - median(raw)) / (args.steps - 1) * 1e6
                     if phase in PHASES else None})
    print_table(f"{args.steps}-step fits on {world} rank(s) (rank 0's), MLP {args.sizes}, {args.rounds} rounds: phases summed over steps 2-{args.steps}",
                ["phase", "raw ms", "fw ms", "fw/raw (paired)", "fw - raw"],
                [[r["phase"], f"{r['raw_s'] * 1e3:.2f}", f"{r['fw_s'] * 1e3:.2f}", f"{r['paired_ratio']:.4f}",
                  f"{(r['fw_s'] - r['raw_s']) * 1e3:+.2f} ms a fit" if r["phase"] not in PHASES
                  else f"{r['fw_minus_raw_us_per_step']:+.1f} µs a step"] for r in rows])
    by_step = extra_by_step(steps)
    typical, extra = standing_out(by_step)
    print("steps that stand out (fw's median minus the loop's, µs, from step N's optimizer step to step N+1's "
          "forward): " + ", ".join(f"after step {k + 1}: {us:+.0f}" for k, us in extra)
          + f"; the median step {typical:+.1f}")
    doc = {"machine": machine_info(), "world_size": world, "steps": args.steps, "rounds": args.rounds, "sizes": args.sizes,
           "malloc_env": bench_fit.malloc_env(), "rows": rows,
           "extra_us_by_step": [us for _, us in by_step], "standing_out": extra}
    print(f"wrote {write_json(result_path('fit_phases' if world == 1 else f'fit_phases_ddp{world}', out=Path(args.out)), doc)}")


def extra_by_step(steps: dict[str, list[list[float]]]) -> list[tuple[int, float]]:
    """(k, fw's median time minus the loop's, µs) from step k + 1's optimizer step to step k + 2's
    forward, in fw's own phases (``OWN``), over the steps both sides ran."""
    count = min(len(fit) for side in steps.values() for fit in side)
    return [(k, (median([fit[k] for fit in steps["fw"]]) - median([fit[k] for fit in steps["raw"]])) * 1e6)
            for k in range(count)]


def standing_out(by_step: list[tuple[int, float]]) -> tuple[float, list[tuple[int, float]]]:
    """The median step's extra time, and the steps whose extra is over 100 µs and five times that."""
    typical = median([us for _, us in by_step])
    return typical, [(k, us) for k, us in by_step if us > max(100.0, 5 * abs(typical))]


if __name__ == "__main__":
    main()
