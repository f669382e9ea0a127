"""A whole ``fit()`` as a user makes it, against the hand-written loop: set-up and teardown included.

Same model (MLP 64-512-512-10), same initial weights, same data (32 samples per rank per step,
``DistributedSampler(shuffle=False)``'s shard), Adam, ``--steps`` steps (100). One call per side
per round, timed on every rank from just before the side builds anything (the Trainer, or DDP
and the loader) to just after it returns; a round's time is the slowest rank's. The sides take
turns (the order rotates every round) in the same processes, so machine noise lands on all of
them; the ratio reported is the median over rounds of fw's time over the raw loop's. ::

    # 2 Gloo ranks under torchrun (the group is made once; every side uses it)
    .venv/bin/python -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/bench_fit.py
    # one process
    .venv/bin/python benchmarks/bench_fit.py --single
    # each rank on a core of its own (less noise from the scheduler moving them)
    .venv/bin/python -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/bench_fit.py --pin
    # where fw's time goes (rank 0, one fw fit under cProfile)
    .venv/bin/python -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/bench_fit.py --profile

``--lightning`` adds Lightning's Trainer as a third side; ``--setup-only`` a side that runs fw's fit
with the loop's epoch inside (fw's set-up and teardown, not its per-batch path); ``--closure`` a
side whose batches all take the closure path (fw before the batch without one); ``--without
heartbeat,stop-checks`` a side for each part of fw's named, with that part switched off (the
heartbeat thread; the stop checks during the epoch, leaving the epoch end's). ``--shuffle`` runs
the sides of each round in a random order (the same on every rank) instead of rotating them: with
three sides or more, rotation keeps each side behind the same one every round (with ``--control``,
the loop behind the loop again), and what the side before leaves in the caches lands on the next.
``bench_fit_instructions.py`` counts the instructions of the same fits instead (valgrind): the work
fw adds, free of the machine's noise. Results: a table, and JSON under ``benchmarks/results/``
(``--out``).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import datetime
import importlib
import io
import os
import pstats
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset  # noqa: E402

import framework as fw  # noqa: E402
from _modules import MLPModule, make_mlp, make_optimizer  # noqa: E402
from framework.bench.common import machine_info, median, print_table, result_path, write_json  # noqa: E402

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


def fw_fit_with_the_loops_epoch(net: nn.Module, data: TensorDataset, steps: int, world: int) -> None:
    """fw's fit with its training epoch replaced by the hand-written loop's (on fw's loader, model
    and optimizer; on several ranks through fw's DDP, whose forward is ``training_step``): fw's
    set-up and teardown alone, and what they leave the steps to run beside."""
    import framework.loops.fit as fit_loop

    def the_loops_epoch(run, loader, stops) -> None:
        model, opt = run.strategy.model, run.optimizers[0]
        for step, (x, y) in enumerate(loader):
            if step == steps:
                break
            loss = model((x, y), step) if world > 1 else F.cross_entropy(run.module.net(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        run.state.global_step = steps

    with mock.patch.object(fit_loop, "run_train_epoch", the_loops_epoch):
        fw_fit(net, data, steps, world)


def fw_fit_with_closures(net: nn.Module, data: TensorDataset, steps: int, world: int) -> None:
    """fw's fit with every batch through the closure, as before the batch without one
    (``loops/optimization.py``'s ``_plain_batch_fn``): what that path saves, in the same run."""
    import framework.loops.optimization as optimization

    with mock.patch.object(optimization, "_nothing_between", lambda run: False):
        fw_fit(net, data, steps, world)


def fw_fit_without(part: str) -> Callable[[nn.Module, TensorDataset, int, int], None]:
    """fw's fit with one of its parts switched off: ``heartbeat`` (no thread beside the run) or
    ``stop-checks`` (the interval between stop checks is then about 5 s of training, longer
    than these fits, so only the fit's first two and the epoch end's run)."""
    from framework.trainer.heartbeat import Heartbeat
    from framework.trainer.preemption import StopCheck

    owner, changes = {
        "heartbeat": (Heartbeat, {"__enter__": lambda self: self, "__exit__": lambda self, *exc: None}),
        "stop-checks": (StopCheck, {"MOST": 10**9}),
    }[part]

    def fit(net: nn.Module, data: TensorDataset, steps: int, world: int) -> None:
        with mock.patch.multiple(owner, **changes):
            fw_fit(net, data, steps, world)

    return fit


def replace_attribute(module_name: str, path: str, wrap: Callable[[Any], Any]) -> None:
    """Replace what ``path`` (dotted: ``Class.method``, or a dict's entry) names in the module
    ``module_name`` by ``wrap(original)``: how the other benchmarks measure parts of a fit."""
    owner: Any = importlib.import_module(module_name)
    *outer, name = path.split(".")
    for attr in outer:
        owner = getattr(owner, attr)
    if isinstance(owner, dict):
        owner[name] = wrap(owner[name])
    else:
        setattr(owner, name, wrap(getattr(owner, name)))


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
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)),
                        help="the MLP's layer sizes (8,16,4: a network whose step is Python's)")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--single", action="store_true", help="one process (no torchrun)")
    parser.add_argument("--lightning", action="store_true", help="Lightning's Trainer as a third side")
    parser.add_argument("--control", action="store_true",
                        help="the hand-written loop again as a side of its own: what this method gives two equal sides")
    parser.add_argument("--setup-only", action="store_true",
                        help="a side whose fit is fw's with the loop's epoch inside: fw's set-up and teardown alone")
    parser.add_argument("--closure", action="store_true",
                        help="a side whose fit takes the closure path on every batch (fw before the plain batch)")
    parser.add_argument("--without", default="", help="heartbeat,stop-checks: a side for each, fw without that part")
    parser.add_argument("--shuffle", action="store_true", help="each round's sides in a random order, not rotated")
    parser.add_argument("--profile", action="store_true", help="cProfile one fw fit on rank 0 instead")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="wall: perf_counter; cpu: the process's CPU time (time the machine gave to"
                             " others is not counted; use with --threads 1)")
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: cores / ranks)")
    parser.add_argument("--pin", action="store_true", help="pin rank r to core r (the scheduler does not move the ranks)")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = parser.parse_args()
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
    if args.setup_only:
        sides["fw_setup_only"] = lambda: fw_fit_with_the_loops_epoch(fresh(), data, args.steps, world)
    if args.closure:
        sides["fw_closure"] = lambda: fw_fit_with_closures(fresh(), data, args.steps, world)
    for part in filter(None, args.without.split(",")):
        without = fw_fit_without(part)
        sides[f"fw_without_{part}"] = lambda without=without: without(fresh(), data, args.steps, world)
    if args.lightning:
        sides["lightning"] = lambda: lightning_fit(fresh(), data, args.steps, world)
    if args.profile:
        return profile(sides, rank, world)

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
