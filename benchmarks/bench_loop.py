"""fw's training loop against a hand-written PyTorch loop, one process (CPU or one GPU).

Why: the per-batch cost of fw's loop is what stays when a fit is long; the target is fw within
1 % of the hand-written loop, and this is the benchmark to rerun when the training step changes
(issue 49: this and ``bench_fit.py`` against the previous commit).
Read: fw/raw (ratio of the medians) and its paired estimate (median of per-round ratios); trust
a difference only where it is larger than the IQR; "bitwise equal" must hold.
Time: about 70 s on 2 cores; ``--quick`` a few seconds.
Run: ``python benchmarks/run.py loop [--quick] [--manual] [--device cuda]``.

Same model (MLP 64-256-256-10), same initial weights (a copied ``state_dict``), same data
(an in-memory ``TensorDataset``, ``DataLoader(shuffle=False)``, batch 64), same optimiser and
the same number of steps. Run::

    .venv/bin/python benchmarks/bench_loop.py            # ~1 minute on 2 CPU cores
    .venv/bin/python benchmarks/bench_loop.py --quick    # a few seconds, a smoke test
    .venv/bin/python benchmarks/bench_loop.py --manual   # fw in manual optimization
    python benchmarks/bench_loop.py --device cuda        # on a GPU machine

What is timed: whole epochs of N steps. For fw, a callback records ``time.perf_counter()`` in
``on_train_epoch_start`` and ``on_train_epoch_end`` (called once per epoch, so nothing is added
per step; the window includes fw's own end-of-epoch work); for the raw loop the same epoch of N
steps. Step time = epoch time / N. On CUDA both sides synchronise at the epoch boundaries.

The two sides alternate (R rounds, each running the raw loop and fw for E epochs, in an order
that flips every round), so that machine noise lands on both. The first epoch of every round is
a warm-up and is dropped. Reported: median step time per side, fw/raw ratio of the medians,
and fw's overhead in µs per step. Target: fw within 1 % of the raw loop.

A separate exactness pass trains both from the same initial weights on the same batches and
reports whether the final parameters are bitwise equal (and the largest absolute difference).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from _modules import EpochTimer, ManualMLPModule, MLPModule, make_mlp, make_optimizer, raw_epochs
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import framework as fw
from framework.bench.common import fmt_time, iqr, machine_info, median, print_table, result_path, write_json

BATCH = 64
SIZES = (64, 256, 256, 10)


def make_data(steps: int, device: torch.device, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(steps * BATCH, SIZES[0], generator=g)
    y = torch.randint(0, SIZES[-1], (steps * BATCH,), generator=g)
    # On CUDA the data lives on the GPU for both sides, so the loop overhead is not hidden
    # behind host-to-device copies (fw passes a tensor already on its device through).
    return TensorDataset(x.to(device), y.to(device))


def raw_side(net: nn.Module, loader: DataLoader, optimizer: str, epochs: int, sync) -> list[float]:
    """The hand-written loop: ``epochs`` epochs; returns each epoch's wall time."""
    return raw_epochs(net, loader, make_optimizer(net.parameters(), optimizer), epochs, sync=sync)

def fw_trainer(device: str, epochs: int, callbacks=None) -> fw.Trainer:
    return fw.Trainer(
        accelerator="cuda" if device.startswith("cuda") else "cpu", devices=1, max_epochs=epochs,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, num_sanity_val_steps=0,
        enable_model_summary=False, callbacks=callbacks,
    )  # fmt: skip


MODULES = {"automatic": MLPModule, "manual": ManualMLPModule}
OPTIMIZATION = "automatic"  # --manual: the module steps its optimizer itself (manual optimization)


def fw_epochs(net: nn.Module, loader: DataLoader, optimizer: str, epochs: int, device: str, sync) -> list[float]:
    timer = EpochTimer(sync)
    trainer = fw_trainer(device, epochs, [timer])
    with contextlib.redirect_stdout(io.StringIO()):  # fw prints a one-line run summary per fit
        trainer.fit(MODULES[OPTIMIZATION](net, optimizer), train_dataloaders=loader)
    return timer.times


def exactness(steps: int, optimizer: str, device: str) -> dict:
    """Train raw and fw from the same weights on the same batches; compare the parameters."""
    dev = torch.device(device)
    torch.manual_seed(1)
    init = make_mlp(SIZES).to(dev)
    raw_net, fw_net = make_mlp(SIZES).to(dev), make_mlp(SIZES).to(dev)
    raw_net.load_state_dict(init.state_dict())
    fw_net.load_state_dict(init.state_dict())
    data = make_data(steps, dev, seed=2)
    raw_side(raw_net, DataLoader(data, batch_size=BATCH, shuffle=False), optimizer, 1, lambda: None)
    fw_epochs(fw_net, DataLoader(data, batch_size=BATCH, shuffle=False), optimizer, 1, device, lambda: None)
    diffs = [(a - b).abs().max().item() for a, b in zip(raw_net.parameters(), fw_net.parameters(), strict=True)]
    bitwise = all(torch.equal(a, b) for a, b in zip(raw_net.parameters(), fw_net.parameters(), strict=True))
    moved = max((a - b).abs().max().item() for a, b in zip(raw_net.parameters(), init.parameters(), strict=True))
    return {"steps": steps, "bitwise_equal": bitwise, "max_abs_diff": max(diffs), "max_abs_change_from_init": moved}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
    parser.add_argument("--steps", type=int, default=200, help="steps per epoch (N)")
    parser.add_argument("--epochs", type=int, default=4, help="epochs per side per round (E; the first is warm-up)")
    parser.add_argument("--rounds", type=int, default=40, help="rounds (R), alternating which side goes first")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (0: leave torch's default)")
    parser.add_argument("--quick", action="store_true", help="a short run (smoke test)")
    parser.add_argument("--manual", action="store_true", help="fw side in manual optimization")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default benchmarks/results)")
    args = parser.parse_args()
    global OPTIMIZATION
    OPTIMIZATION = "manual" if args.manual else "automatic"
    if args.quick:
        args.steps, args.epochs, args.rounds = 50, 3, 4
    if args.threads:
        torch.set_num_threads(args.threads)
    device = args.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("--device cuda: CUDA is not available here")
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    dev = torch.device(device)

    exact = exactness(args.steps, args.optimizer, device)

    torch.manual_seed(0)
    init = make_mlp(SIZES).to(dev)
    raw_net, fw_net = make_mlp(SIZES).to(dev), make_mlp(SIZES).to(dev)
    raw_net.load_state_dict(init.state_dict())
    fw_net.load_state_dict(init.state_dict())
    data = make_data(args.steps, dev)
    raw_loader = DataLoader(data, batch_size=BATCH, shuffle=False)
    fw_loader = DataLoader(data, batch_size=BATCH, shuffle=False)

    samples: dict[str, list[float]] = {"raw": [], "fw": []}
    wall = time.perf_counter()
    for r in range(args.rounds):
        order = ("raw", "fw") if r % 2 == 0 else ("fw", "raw")
        for side in order:
            if side == "raw":
                times = raw_side(raw_net, raw_loader, args.optimizer, args.epochs, sync)
            else:
                times = fw_epochs(fw_net, fw_loader, args.optimizer, args.epochs, device, sync)
            samples[side].extend(t / args.steps for t in times[1:])  # first epoch: warm-up
    wall = time.perf_counter() - wall

    raw_med, fw_med = median(samples["raw"]), median(samples["fw"])
    # paired estimate: rounds pair up naturally (same round, same noise); median of the ratios
    per_round = args.epochs - 1
    paired = [
        median(samples["fw"][i * per_round : (i + 1) * per_round]) / median(samples["raw"][i * per_round : (i + 1) * per_round])
        for i in range(args.rounds)
    ]  # fmt: skip
    result = {
        "benchmark": "loop",
        **machine_info(device),
        "device": device,
        "model": "MLP " + "-".join(map(str, SIZES)),
        "params": sum(p.numel() for p in init.parameters()),
        "batch_size": BATCH,
        "optimizer": args.optimizer,
        "optimization": OPTIMIZATION,
        "steps_per_epoch": args.steps,
        "epochs_per_round": args.epochs,
        "rounds": args.rounds,
        "quick": args.quick,
        "statistic": "median over epochs (first epoch of each round dropped) of epoch time / steps",
        "raw_step_s": raw_med,
        "fw_step_s": fw_med,
        "raw_step_iqr_s": iqr(samples["raw"]),
        "fw_step_iqr_s": iqr(samples["fw"]),
        "ratio_fw_over_raw": fw_med / raw_med,
        "ratio_paired_median": median(paired),
        "overhead_us_per_step": (fw_med - raw_med) * 1e6,
        "target": "ratio <= 1.01",
        "exactness": exact,
        "wall_s": wall,
        "samples_step_s": samples,
    }
    path = write_json(result_path("loop" if OPTIMIZATION == "automatic" else "loop-manual", device, args.out), result)

    print_table(
        f"fw vs raw PyTorch loop — {result['model']}, batch {BATCH}, {args.optimizer}, {OPTIMIZATION} optimization, "
        f"{result['hardware']}, {device}",
        ["side", "median step", "IQR", "epochs timed"],
        [
            ["raw PyTorch", fmt_time(raw_med), " – ".join(fmt_time(v) for v in result["raw_step_iqr_s"]), len(samples["raw"])],
            ["fw Trainer", fmt_time(fw_med), " – ".join(fmt_time(v) for v in result["fw_step_iqr_s"]), len(samples["fw"])],
        ],
        caption=(
            f"fw/raw = {result['ratio_fw_over_raw']:.4f} (paired per round: {result['ratio_paired_median']:.4f}), "
            f"overhead {result['overhead_us_per_step']:+.2f} µs/step; exactness over {exact['steps']} steps: "
            f"{'bitwise equal' if exact['bitwise_equal'] else 'max |diff| ' + format(exact['max_abs_diff'], '.3g')}"
        ),
    )  # fmt: skip
    print(f"wrote {path} ({wall:.0f} s)")


if __name__ == "__main__":
    main()
