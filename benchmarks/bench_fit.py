"""fw's overhead on a whole ``fit()`` as users call it, fixed costs included, against a hand-written loop.

Why: what a user waits for is the whole call, set-up and teardown included; the per-batch figure
(``bench_loop.py``) leaves those out. This is the benchmark that answered how much fw adds to a
short fit (1-3 %: ``reports/2026-12-06-fit-overhead.md``), and the one to rerun when a change
may have moved it (issue 49: this and ``bench_loop.py`` against the previous commit).
Read: the table's ``/raw`` column is the median over rounds of each side's time over the raw
loop's in the same round, with a 95 % bootstrap interval; ``raw_again`` (``--control``) is the
loop against itself, the method's own bias: believe a difference of fw's only where it is
larger than that side's distance from 1 and than the interval. ``lightning`` (``--lightning``)
puts Lightning's Trainer in the same run.
Time: ~40 s on 2 cores (9 rounds of 100-step fits, 2 ranks); ``--quick`` a few seconds.
Run: ``python benchmarks/run.py fit [--control] [--lightning]`` (2 Gloo ranks under torchrun);
``python benchmarks/run.py fit --single`` (one process).

Same model (MLP 64-512-512-10), same initial weights, same data (32 samples per rank per step,
``DistributedSampler(shuffle=False)``'s shard), Adam, ``--steps`` steps (100). One call per side
per round, timed on every rank from just before the side builds anything (the Trainer, or DDP
and the loader) to just after it returns; a round's time is the slowest rank's. The sides take
turns (the order rotates every round) in the same processes, so machine noise lands on all of
them. Only public API is used: fw's side is ``fw.Trainer(...).fit(...)``, nothing inside it is
replaced. ::

    # 2 Gloo ranks under torchrun (the group is made once; every side uses it)
    .venv/bin/python -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/bench_fit.py --control
    # one process
    .venv/bin/python benchmarks/bench_fit.py --single --control
    # each rank on a core of its own (less noise from the scheduler moving them)
    .venv/bin/python -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/bench_fit.py --pin
    # where fw's time goes (rank 0, one fw fit under cProfile)
    .venv/bin/python -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/bench_fit.py --profile

``--shuffle`` runs the sides of each round in a random order (the same on every rank) instead of
rotating them: with three sides or more, rotation keeps each side behind the same one every
round, and what the side before leaves in the caches lands on the next. ``--clock cpu`` counts
the process's CPU time instead of wall time (use with ``--threads 1``). Results: a table, and
JSON under ``benchmarks/results/`` (``--out``), ``fit_single-...`` or ``fit_ddp2-...``.

The scripts that split this question further (``bench_fit_fixed.py``, ``bench_fit_phases.py``,
``bench_fit_timeline.py``, ``bench_fit_instructions.py``, and this script's ``--setup-only``,
``--closure`` and ``--without`` sides) replaced fw's private functions to time them; they served
the finished 2 % question and were removed (benchmarks/README.md says where they are kept).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import datetime
import io
import os
import pstats
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import torch.distributed as dist
import torch.nn.functional as F
from _modules import MLPModule, make_mlp, make_optimizer
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import framework as fw
from framework.bench.common import machine_info, median, print_table, result_path, write_json

#: the processes ``benchmarks/run.py`` starts this script in (under torchrun; ``--ranks`` overrides)
LAUNCH_RANKS = 2
SIZES = (64, 512, 512, 10)
PER_RANK_BATCH = 32
QUIET = dict(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
             enable_model_summary=False, num_sanity_val_steps=0)


def raw_fit(net: nn.Module, data: TensorDataset, steps: int, rank: int, world: int) -> None:
    """The hand-written loop: DDP (several ranks) + DistributedSampler, Adam, ``steps`` steps."""
    model = nn.parallel.DistributedDataParallel(net) if world > 1 else net
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=False) if world > 1 else None
    loader = DataLoader(data, batch_size=PER_RANK_BATCH, sampler=sampler)
    opt = make_optimizer(model.parameters())
    model.train()
    for step, (x, y) in enumerate(loader):
        if step == steps:
            break
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def fw_fit(net: nn.Module, data: TensorDataset, steps: int, world: int) -> None:
    trainer = fw.Trainer(**QUIET, devices=world, strategy="ddp_gloo" if world > 1 else "single", max_steps=steps)
    with contextlib.redirect_stderr(io.StringIO()):  # fw's one-line run summary
        trainer.fit(MLPModule(net), DataLoader(data, batch_size=PER_RANK_BATCH))


def lightning_fit(net: nn.Module, data: TensorDataset, steps: int, world: int) -> None:
    import pytorch_lightning as pl

    class LitMLP(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return make_optimizer(self.parameters())

    trainer = pl.Trainer(accelerator="cpu", devices=world, strategy="ddp" if world > 1 else "auto",
                         max_steps=steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0)
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        trainer.fit(LitMLP(), DataLoader(data, batch_size=PER_RANK_BATCH))


def workload(steps: int, world: int) -> tuple[TensorDataset, Callable[[], nn.Module]]:
    """The data of ``steps`` steps on ``world`` ranks, and a maker of the network, every time
    with the same initial weights."""
    g = torch.Generator().manual_seed(0)
    n = steps * PER_RANK_BATCH * world
    data = TensorDataset(torch.randn(n, SIZES[0], generator=g), torch.randint(0, SIZES[-1], (n,), generator=g))
    torch.manual_seed(0)
    initial = make_mlp(SIZES).state_dict()

    def fresh() -> nn.Module:
        net = make_mlp(SIZES)
        net.load_state_dict(initial)
        return net

    return data, fresh


def main() -> None:
    global SIZES
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 10 steps, 2 rounds")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)),
                        help="the MLP's layer sizes (8,16,4: a network whose step is Python's)")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--single", action="store_true", help="one process (no torchrun)")
    parser.add_argument("--lightning", action="store_true", help="Lightning's Trainer as a third side")
    parser.add_argument("--control", action="store_true",
                        help="the hand-written loop again as a side of its own: what this method gives two equal sides")
    parser.add_argument("--shuffle", action="store_true", help="each round's sides in a random order, not rotated")
    parser.add_argument("--profile", action="store_true", help="cProfile one fw fit on rank 0 instead")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="wall: perf_counter; cpu: the process's CPU time (time the machine gave to"
                             " others is not counted; use with --threads 1)")
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: cores / ranks)")
    parser.add_argument("--pin", action="store_true", help="pin rank r to core r (the scheduler does not move the ranks)")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = parser.parse_args()
    if args.quick:
        args.steps, args.rounds = 10, 2
    SIZES = tuple(int(size) for size in args.sizes.split(","))
    world = 1 if args.single else int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    rank = dist.get_rank() if world > 1 else 0
    if args.pin:
        os.sched_setaffinity(0, {rank % (os.cpu_count() or 1)})
    torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // world))
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    data, fresh = workload(args.steps, world)
    sides = {"raw": lambda: raw_fit(fresh(), data, args.steps, rank, world),
             "fw": lambda: fw_fit(fresh(), data, args.steps, world)}
    if args.control:
        sides["raw_again"] = lambda: raw_fit(fresh(), data, args.steps, rank, world)
    if args.lightning:
        sides["lightning"] = lambda: lightning_fit(fresh(), data, args.steps, world)
    if args.profile:
        profile(sides, rank, world)
        return

    for side in sides.values():  # warm-up: imports, first-call costs
        side()
    times: dict[str, list[float]] = {name: [] for name in sides}
    names, order = list(sides), random.Random(0)  # the same seed, so the same order, on every rank
    for r in range(args.rounds):
        for name in order.sample(names, len(names)) if args.shuffle else names[r % len(names):] + names[:r % len(names)]:
            times[name].append(timed(sides[name], world, clock))
    report(times, args, world)


def timed(side, world: int, clock=time.perf_counter) -> float:
    """Time of one call on ``clock``, the slowest rank's (every rank starts together)."""
    if world > 1:
        dist.barrier()
    start = clock()
    side()
    mine = torch.tensor([clock() - start], dtype=torch.float64)
    if world > 1:
        dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    return float(mine)


def profile(sides: dict, rank: int, world: int) -> None:
    sides["fw"]()  # warm
    profiler = cProfile.Profile()
    if world > 1:
        dist.barrier()
    profiler.enable()
    sides["fw"]()
    profiler.disable()
    if rank == 0:
        stats = pstats.Stats(profiler, stream=sys.stdout)
        stats.sort_stats("cumulative").print_stats(40)
        stats.sort_stats("tottime").print_stats(25)
        stats.print_callers("distributed_c10d.py.*(all_reduce|broadcast|barrier|all_gather|all_gather_object|broadcast_object_list)$")


def malloc_env() -> dict[str, str]:
    """The glibc allocator settings of this run (``MALLOC_*``): they move one-process timings by a few %."""
    return {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}


def median_interval(ratios: list[float], draws: int = 2000) -> tuple[float, float]:
    """A 95 % bootstrap interval of the median ratio: how far this run's noise leaves it open."""
    rng = random.Random(0)
    medians = sorted(median(rng.choices(ratios, k=len(ratios))) for _ in range(draws))
    return medians[int(0.025 * draws)], medians[int(0.975 * draws) - 1]


def report(times: dict[str, list[float]], args, world: int) -> None:
    if world > 1 and dist.get_rank() != 0:
        return
    raw = times["raw"]
    rows = []
    for name, values in times.items():
        ratios = [t / r for t, r in zip(values, raw, strict=True)]
        low, high = median_interval(ratios)
        rows.append({"side": name, "median_s": median(values), "min_s": min(values), "max_s": max(values),
                     "ratio_to_raw": median(ratios), "ratio_95ci": [low, high], "ratios": ratios})
    print_table(f"{args.steps}-step fit on {world} rank(s), whole call (set-up and teardown included), "
                f"{args.rounds} rounds, {args.clock} clock, {torch.get_num_threads()} thread(s)", ["side", "median s", "min s", "max s", "/raw (median of rounds)", "95% interval"],
                [[r["side"], f"{r['median_s']:.3f}", f"{r['min_s']:.3f}", f"{r['max_s']:.3f}",
                  f"{r['ratio_to_raw']:.3f}", "{:.3f}-{:.3f}".format(*r["ratio_95ci"])] for r in rows])
    doc = {"machine": machine_info(), "world_size": world, "steps": args.steps, "sizes": list(SIZES), "rounds": args.rounds,
           "clock": args.clock, "threads": torch.get_num_threads(),
           "malloc_env": malloc_env(),
           "sides": rows, "times": times}
    path = write_json(result_path(f"fit_{'single' if world == 1 else f'ddp{world}'}", out=Path(args.out)), doc)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
