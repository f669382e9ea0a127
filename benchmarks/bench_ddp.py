"""fw's DDP strategies against hand-written DDP loops: 2 ranks on the CPU, in one job.

Same model (MLP 64-512-512-10), same initial weights, same data (32 samples per rank per step,
rank r takes samples r, r+2, ... as ``DistributedSampler(shuffle=False)`` gives them), same
optimiser (Adam), same number of steps. Two modes::

    # Gloo: the raw torchrun + DDP loop against fw's ddp_gloo (~1 minute)
    .venv/bin/python -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/bench_ddp.py
    .venv/bin/python benchmarks/bench_ddp.py          # the same: re-launches itself under torchrun

    # MPI: fw's mpi strategy against raw Gloo DDP and fw's ddp_gloo (~1.5 minutes)
    .venv/bin/mpiexec -n 2 .venv/bin/python -m mpi4py benchmarks/bench_ddp.py --backend mpi
    .venv/bin/python benchmarks/bench_ddp.py --backend mpi    # re-launches itself under mpiexec

Each side runs E epochs of N steps per round; the sides take turns (the order rotates every
round) so that machine noise lands on all of them. Epochs are timed on every rank (fw: a
callback's ``on_train_epoch_start``/``on_train_epoch_end``, called once per epoch); an epoch's
time is the slowest rank's; the first epoch of every round (DDP rebuilds its buckets in its
first iteration) is dropped; step time = median epoch time / N.

Gloo mode: ``init_process_group("gloo")`` once (env:// from torchrun); the raw loop wraps the
model in DDP each round, and fw's ``ddp_gloo`` finds the group already initialised, uses it and
leaves it alone at teardown.

MPI mode: the default group is Gloo (TCP, port picked by rank 0 and sent over MPI) and an
``fw_mpi`` group (mpi4py ProcessGroup) is made with ``new_group`` (the order that works, see
``framework/strategies/mpi/backend.py``). Sides: ``raw_gloo`` (DDP on the default group),
``fw_ddp_gloo`` (fw finds the group initialised and uses it), ``raw_fw_mpi`` (hand-written DDP
with ``process_group=`` the fw_mpi group) and ``fw_mpi`` (fw's ``MPIStrategy`` with
``ddp_kwargs["process_group"]`` set to that group: the same per-step path as ``strategy=mpi``,
where fw makes fw_mpi the default group itself). ``raw_fw_mpi`` separates fw's own overhead from
the cost of moving gradients over MPI. (Initialising and destroying a Gloo and an fw_mpi default
group in turn, side by side, hung on the second Gloo init here, so the groups live for the
whole run.)

An exactness pass first trains every side from the same weights for N steps and reports the
largest parameter difference to the raw Gloo loop (bitwise equality expected).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import os
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset  # noqa: E402

import framework as fw  # noqa: E402
from framework.strategies import MPIStrategy  # noqa: E402
from _modules import EpochTimer, MLPModule, make_mlp, make_optimizer, raw_epochs  # noqa: E402
from framework.bench.common import fmt_time, iqr, machine_info, median, print_table, result_path, write_json  # noqa: E402

SIZES = (64, 512, 512, 10)
PER_RANK_BATCH = 32
MPI_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK")

LABELS = {
    "raw_gloo": "raw DDP, Gloo",
    "fw_ddp_gloo": "fw ddp_gloo",
    "raw_fw_mpi": "raw DDP, fw_mpi group",
    "fw_mpi": "fw mpi",
}


# -- process groups -------------------------------------------------------------------------------
class Comm:
    """Rank, world size and a side channel for results that does not depend on the sides' groups."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        if backend == "mpi":
            from mpi4py import MPI

            from framework.strategies.mpi.backend import register_mpi_backend

            self.mpi = MPI.COMM_WORLD
            self.rank, self.size = self.mpi.Get_rank(), self.mpi.Get_size()
            port = self.free_port()
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=self.rank,
                                    world_size=self.size, timeout=datetime.timedelta(seconds=300))
            # Gloo default + an fw_mpi subgroup works; the reverse cannot rendezvous (strategies/mpi/backend.py)
            self.mpi_group = dist.new_group(backend=register_mpi_backend())
        else:
            dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
            self.rank, self.size = dist.get_rank(), dist.get_world_size()

    def gather(self, obj):
        """Every rank's ``obj``, on every rank."""
        if self.backend == "mpi":
            return self.mpi.allgather(obj)
        out = [None] * self.size
        dist.all_gather_object(out, obj)
        return out

    def free_port(self) -> int:
        port = None
        if self.rank == 0:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
        return self.mpi.bcast(port, root=0)


# -- the sides ------------------------------------------------------------------------------------
def raw_ddp(comm: Comm, net: nn.Module, data: TensorDataset, epochs: int, group=None) -> list[float]:
    """The hand-written loop: DDP + DistributedSampler, ``epochs`` epochs; epoch wall times."""
    model = nn.parallel.DistributedDataParallel(net, process_group=group)
    sampler = DistributedSampler(data, num_replicas=comm.size, rank=comm.rank, shuffle=False)
    loader = DataLoader(data, batch_size=PER_RANK_BATCH, sampler=sampler)
    return raw_epochs(model, loader, make_optimizer(model.parameters()), epochs, before_epoch=sampler.set_epoch)


def fw_ddp(comm: Comm, net: nn.Module, data: TensorDataset, epochs: int, strategy) -> list[float]:
    """fw's Trainer with ``strategy``; fw shards the plain loader itself."""
    if strategy == "mpi":
        # fw's MPIStrategy on the fw_mpi group: the same per-step path (fw loop + DDP over the
        # mpi4py ProcessGroup) as a job where fw initialises fw_mpi as the default group.
        strategy = MPIStrategy()
        strategy.ddp_kwargs["process_group"] = comm.mpi_group
    timer = EpochTimer()
    trainer = fw.Trainer(
        accelerator="cpu", devices=comm.size, strategy=strategy, max_epochs=epochs, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, num_sanity_val_steps=0, callbacks=[timer],
    )  # fmt: skip
    loader = DataLoader(data, batch_size=PER_RANK_BATCH, shuffle=False)
    with contextlib.redirect_stdout(io.StringIO()):  # fw prints a one-line run summary per fit
        trainer.fit(MLPModule(net), train_dataloaders=loader)
    return timer.times


def run_side(comm: Comm, side: str, net: nn.Module, data: TensorDataset, epochs: int) -> list[float]:
    if side == "raw_gloo":
        return raw_ddp(comm, net, data, epochs)
    if side == "raw_fw_mpi":
        return raw_ddp(comm, net, data, epochs, comm.mpi_group)
    return fw_ddp(comm, net, data, epochs, {"fw_ddp_gloo": "ddp_gloo", "fw_mpi": "mpi"}[side])


def make_data(comm: Comm, steps: int, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    n = steps * PER_RANK_BATCH * comm.size
    return TensorDataset(torch.randn(n, SIZES[0], generator=g), torch.randint(0, SIZES[-1], (n,), generator=g))


def exactness(comm: Comm, sides: list[str], steps: int) -> dict:
    torch.manual_seed(1)
    init = make_mlp(SIZES)
    data = make_data(comm, steps, seed=2)
    final = {}
    for side in sides:
        net = make_mlp(SIZES)
        net.load_state_dict(init.state_dict())
        run_side(comm, side, net, data, 1)
        final[side] = [p.detach().clone() for p in net.parameters()]
    ref = final[sides[0]]
    out = {"steps": steps, "reference": sides[0]}
    for side in sides[1:]:
        out[side] = {
            "bitwise_equal": all(torch.equal(a, b) for a, b in zip(ref, final[side])),
            "max_abs_diff": max((a - b).abs().max().item() for a, b in zip(ref, final[side])),
        }
    # every rank must hold the same parameters after DDP
    digests = comm.gather([float(p.double().sum()) for p in ref])
    out["ranks_agree"] = all(d == digests[0] for d in digests)
    return out


# -- main -----------------------------------------------------------------------------------------
def relaunch_if_needed(args: argparse.Namespace) -> None:
    """Started as a plain script: re-run this file under torchrun or mpiexec with 2 ranks."""
    here, argv = os.path.abspath(__file__), sys.argv[1:]
    if args.backend == "gloo" and "RANK" not in os.environ:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.nproc), here, *argv]
    elif args.backend == "mpi" and not any(v in os.environ for v in MPI_VARS):
        mpiexec = Path(sys.executable).parent / "mpiexec"
        cmd = [str(mpiexec if mpiexec.exists() else "mpiexec"), "-n", str(args.nproc), sys.executable, "-m", "mpi4py", here, *argv]
    else:
        return
    print("+", " ".join(cmd), flush=True)
    os.execv(cmd[0], cmd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", choices=("gloo", "mpi"), default="gloo")
    parser.add_argument("--steps", type=int, default=40, help="steps per epoch (N)")
    parser.add_argument("--epochs", type=int, default=4, help="epochs per side per round (E; first is warm-up)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (R); default 30 (gloo) or 12 (mpi)")
    parser.add_argument("--nproc", type=int, default=2, help="ranks, when this script launches itself")
    parser.add_argument("--quick", action="store_true", help="a short run (smoke test)")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default benchmarks/results)")
    args = parser.parse_args()
    relaunch_if_needed(args)
    if args.rounds is None:
        args.rounds = 30 if args.backend == "gloo" else 12
    if args.quick:
        args.steps, args.epochs, args.rounds = 20, 3, 3
    torch.set_num_threads(1)  # 2 ranks on 2 cores; launchers disagree on the default

    comm = Comm(args.backend)
    sides = ["raw_gloo", "fw_ddp_gloo"] + (["raw_fw_mpi", "fw_mpi"] if args.backend == "mpi" else [])
    exact = exactness(comm, sides, args.steps)

    torch.manual_seed(0)
    init = make_mlp(SIZES)
    nets = {}
    for side in sides:
        nets[side] = make_mlp(SIZES)
        nets[side].load_state_dict(init.state_dict())
    data = make_data(comm, args.steps)
    mine: dict[str, list[float]] = {s: [] for s in sides}
    fixed: dict[str, list[float]] = {s: [] for s in sides}  # whole call minus its epochs
    wall = time.perf_counter()
    for r in range(args.rounds):
        order = sides[r % len(sides):] + sides[: r % len(sides)]
        if r % 2:
            order.reverse()
        for side in order:
            start = time.perf_counter()
            epochs = run_side(comm, side, nets[side], data, args.epochs)
            fixed[side].append(time.perf_counter() - start - sum(epochs))
            mine[side].extend(epochs[1:])
    wall = time.perf_counter() - wall

    every = comm.gather((mine, fixed))
    if comm.rank == 0:
        slowest = {s: [max(rank[0][s][i] for rank in every) / args.steps for i in range(len(mine[s]))] for s in sides}
        fixed_slowest = {s: [max(rank[1][s][i] for rank in every) for i in range(len(fixed[s]))] for s in sides}
        report(args, comm, sides, slowest, exact, wall, fixed_slowest)
    dist.destroy_process_group()


def report(args, comm: Comm, sides: list[str], slowest: dict, exact: dict, wall: float, fixed: dict) -> None:
    med = {s: median(v) for s, v in slowest.items()}
    fixed_med = {s: median(v) for s, v in fixed.items()}
    base = med["raw_gloo"]
    ratios = {"fw_ddp_gloo_over_raw_gloo": med["fw_ddp_gloo"] / base}
    if args.backend == "mpi":
        ratios["fw_mpi_over_raw_fw_mpi"] = med["fw_mpi"] / med["raw_fw_mpi"]
        ratios["fw_mpi_over_raw_gloo"] = med["fw_mpi"] / base
        ratios["fw_mpi_over_fw_ddp_gloo"] = med["fw_mpi"] / med["fw_ddp_gloo"]
    name = "ddp" if args.backend == "gloo" else "ddp-mpi"
    result = {
        "benchmark": name,
        **machine_info("cpu"),
        "launcher": "torchrun" if args.backend == "gloo" else "mpiexec",
        "world_size": comm.size,
        "model": "MLP " + "-".join(map(str, SIZES)),
        "params": sum(p.numel() for p in make_mlp(SIZES).parameters()),
        "per_rank_batch": PER_RANK_BATCH,
        "optimizer": "adam",
        "steps_per_epoch": args.steps,
        "epochs_per_round": args.epochs,
        "rounds": args.rounds,
        "quick": args.quick,
        "statistic": "median over epochs (first of each round dropped) of the slowest rank's epoch time / steps",
        "step_s": med,
        "step_iqr_s": {s: iqr(v) for s, v in slowest.items()},
        "ratios": ratios,
        "overhead_us_per_step": {"fw_ddp_gloo": (med["fw_ddp_gloo"] - base) * 1e6,
                                 **({"fw_mpi": (med["fw_mpi"] - med["raw_fw_mpi"]) * 1e6} if args.backend == "mpi" else {})},
        "target": "fw_ddp_gloo / raw_gloo <= 1.02; fixed cost within 30 ms of raw",
        "fixed_cost_statistic": "median over rounds of the slowest rank's (whole call - its epochs): set-up + teardown",
        "fixed_cost_s": fixed_med,
        "fixed_cost_iqr_s": {s: iqr(v) for s, v in fixed.items()},
        "fixed_cost_over_raw_ms": {"fw_ddp_gloo": (fixed_med["fw_ddp_gloo"] - fixed_med["raw_gloo"]) * 1e3,
                                   **({"fw_mpi": (fixed_med["fw_mpi"] - fixed_med["raw_fw_mpi"]) * 1e3}
                                      if args.backend == "mpi" else {})},
        "exactness": exact,
        "wall_s": wall,
        "samples_step_s": slowest,
    }  # fmt: skip
    if args.backend == "mpi":
        from framework.strategies.mpi.backend import mpi_library_version

        result["mpi_library"] = mpi_library_version()
    path = write_json(result_path(name, "cpu", args.out), result)
    rows = []
    for s in sides:
        ref = "raw_fw_mpi" if s == "fw_mpi" else "raw_gloo"
        vs_ref = f"{med[s] / med[ref]:.4f}" if s.startswith("fw") else ""
        ex = "reference" if s == exact["reference"] else ("bitwise" if exact[s]["bitwise_equal"] else f"{exact[s]['max_abs_diff']:.2g}")
        rows.append([LABELS[s], fmt_time(med[s]), " – ".join(fmt_time(v) for v in result["step_iqr_s"][s]),
                     f"{med[s] / base:.4f}", vs_ref, fmt_time(fixed_med[s]), ex])  # fmt: skip
    print_table(
        f"DDP step time, {comm.size} ranks, {result['model']}, {PER_RANK_BATCH}/rank, {result['hardware']}",
        ["side", "median step (slowest rank)", "IQR", "vs raw Gloo", "fw vs its raw", "fixed cost per call",
         f"params after {exact['steps']} steps"],
        rows,
        caption=f"{len(slowest['raw_gloo'])} epochs of {args.steps} steps per side; ranks agree: {exact['ranks_agree']}",
    )
    extra = ", ".join(f"{s} {v:+.1f} ms" for s, v in result["fixed_cost_over_raw_ms"].items())
    print(f"fixed cost of a fit (set-up + teardown) over the hand-written loop's: {extra}")
    print(f"wrote {path} ({wall:.0f} s)")


if __name__ == "__main__":
    main()
