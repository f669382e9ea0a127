"""GPU benchmarks for one machine with one GPU: NCCL all-reduce, and fw against raw loops.

Why: the CPU machines cannot show what fw costs where the step is fast; this is the one
prepared run for a lent GPU machine (``gpu_session.sh`` calls it).
Read: fw / raw per part, as ``bench_loop.py`` reads; the all-reduce times are a launch cost with
a world of one, not a network's.
Time: about 2.5 minutes on one H200; ``--quick`` under a minute. Needs CUDA.
Run: ``python benchmarks/run.py gpu [--quick]``.

    python benchmarks/bench_gpu.py            # ~1-2 minutes on one H200
    python benchmarks/bench_gpu.py --quick

Parts (each in its own try/except: a part that fails records its error in the JSON and the
others still run):

1. ``nccl_allreduce``: all-reduce time by message size over NCCL with a world of one GPU (what
   a one-GPU machine can show: the launch and copy cost, not a network), CUDA-event timed,
   median after warm-up.
2. ``loop``: ``bench_loop.py --device cuda`` (fw vs the hand-written loop, one GPU, data on the
   GPU) as a subprocess; its own JSON is kept and summarised here.
3. ``strategies``: MLP 64-512-512-10, batch 64, data on the GPU, side by side and interleaved:
   the raw loop and fw ``single``; raw ``DistributedDataParallel`` over NCCL (world size 1) and
   fw ``ddp_nccl``; raw ``nn.DataParallel`` over one GPU and fw ``dp``. Epochs are timed with
   ``torch.cuda.synchronize`` at their boundaries; step time = median epoch time / steps.

Results: ``benchmarks/results/gpu-<date>-<gpu>.json`` and a table.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import os
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from framework.bench.common import RESULTS, fmt_time, machine_info, median, print_table, result_path, write_json

SIZES = {"1KB": 1 << 10, "64KB": 1 << 16, "1MB": 1 << 20, "16MB": 1 << 24, "256MB": 1 << 28}
MLP = (64, 512, 512, 10)
BATCH = 64


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_nccl_group() -> None:
    """A world-size-1 NCCL default group (the only NCCL world one GPU allows)."""
    if not dist.is_initialized():
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                                timeout=datetime.timedelta(seconds=60), device_id=torch.device("cuda:0"))


# -- 1. NCCL all-reduce --------------------------------------------------------------------------
def nccl_allreduce(quick: bool) -> list[dict]:
    ensure_nccl_group()
    rows = []
    for label, nbytes in SIZES.items():
        t = torch.ones(nbytes // 4, device="cuda")
        iters = 20 if quick else (200 if nbytes <= 1 << 20 else 50)
        for _ in range(5):
            dist.all_reduce(t)
        times = []
        for _ in range(iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dist.all_reduce(t)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        med = median(times)
        rows.append({"size": label, "bytes": nbytes, "iters": iters, "nccl_s": med, "nccl_GBps": nbytes / med / 1e9})
    return rows


# -- 2. fw vs raw loop on one GPU (bench_loop.py) --------------------------------------------------
def loop(quick: bool, out: Path) -> dict:
    cmd = [sys.executable, str(Path(__file__).with_name("bench_loop.py")), "--device", "cuda", "--out", str(out)]
    cmd += ["--quick"] if quick else ["--rounds", "16"]
    path = result_path("loop", "cuda", out)  # the name bench_loop.py's run is about to take
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"bench_loop.py exited {proc.returncode}: {proc.stderr[-2000:]}")
    full = json.loads(path.read_text())
    keep = ("raw_step_s", "fw_step_s", "ratio_fw_over_raw", "ratio_paired_median", "overhead_us_per_step", "exactness")
    return {"file": path.name, **{k: full[k] for k in keep}}


# -- 3. strategies, side by side ------------------------------------------------------------------
def strategies(quick: bool) -> dict:
    from _modules import EpochTimer, MLPModule, make_mlp, make_optimizer, raw_epochs

    import framework as fw

    steps, epochs, rounds = (50, 3, 3) if quick else (200, 4, 8)
    ensure_nccl_group()  # raw DDP and fw ddp_nccl share it (fw leaves a group it did not create)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(steps * BATCH, MLP[0], generator=g).cuda()
    y = torch.randint(0, MLP[-1], (steps * BATCH,), generator=g).cuda()
    data = TensorDataset(x, y)

    def raw(wrap):
        def run(net):
            model = wrap(net)
            loader = DataLoader(data, batch_size=BATCH, shuffle=False)
            return raw_epochs(model, loader, make_optimizer(model.parameters()), epochs, sync=torch.cuda.synchronize)
        return run

    def fw_side(strategy):
        def run(net):
            timer = EpochTimer(torch.cuda.synchronize)
            trainer = fw.Trainer(accelerator="cuda", devices=1, strategy=strategy, max_epochs=epochs, logger=False,
                                 enable_checkpointing=False, enable_progress_bar=False, num_sanity_val_steps=0,
                                 callbacks=[timer])
            with contextlib.redirect_stdout(io.StringIO()):
                trainer.fit(MLPModule(net), train_dataloaders=DataLoader(data, batch_size=BATCH, shuffle=False))
            return timer.times
        return run

    sides = {
        "raw_single": raw(lambda n: n),
        "fw_single": fw_side("single"),
        "raw_ddp_nccl": raw(lambda n: nn.parallel.DistributedDataParallel(n, device_ids=[0])),
        "fw_ddp_nccl": fw_side("ddp_nccl"),
        "raw_dp": raw(lambda n: nn.DataParallel(n, device_ids=[0])),
        "fw_dp": fw_side("dp"),
    }
    torch.manual_seed(0)
    init = make_mlp(MLP)
    nets = {}
    for name in sides:
        nets[name] = make_mlp(MLP).cuda()
        nets[name].load_state_dict(init.state_dict())
    samples: dict[str, list[float]] = {k: [] for k in sides}
    errors: dict[str, str] = {}
    names = list(sides)
    for r in range(rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in (order if r % 2 == 0 else order[::-1]):
            if name in errors:
                continue
            try:
                samples[name].extend(t / steps for t in sides[name](nets[name])[1:])
            except Exception as err:  # record and go on with the other sides
                errors[name] = f"{type(err).__name__}: {err}"
    med = {k: median(v) for k, v in samples.items() if v}
    ratios = {f"{k}_over_raw": med[f"fw_{k}"] / med[f"raw_{k}"] for k in ("single", "ddp_nccl", "dp")
              if f"fw_{k}" in med and f"raw_{k}" in med}
    return {"model": "MLP " + "-".join(map(str, MLP)), "batch": BATCH, "steps_per_epoch": steps,
            "epochs_per_round": epochs, "rounds": rounds, "step_s": med, "ratios_fw": ratios, "errors": errors}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_gpu.py: CUDA is not available here")
    os.environ.setdefault("NCCL_DEBUG", "WARN")
    result: dict = {"benchmark": "gpu", **machine_info("cuda"), "quick": args.quick, "errors": {}}
    with contextlib.suppress(Exception):
        result["nccl_version"] = ".".join(map(str, torch.cuda.nccl.version()))
    parts = {
        "nccl_allreduce": lambda: nccl_allreduce(args.quick),
        "loop": lambda: loop(args.quick, args.out),
        "strategies": lambda: strategies(args.quick),
    }
    wall = time.perf_counter()
    for name, fn in parts.items():
        t0 = time.perf_counter()
        try:
            result[name] = fn()
        except Exception as err:  # every part is independent
            result["errors"][name] = "".join(traceback.format_exception_only(type(err), err)).strip()
            traceback.print_exc()
        result.setdefault("part_wall_s", {})[name] = time.perf_counter() - t0
    result["wall_s"] = time.perf_counter() - wall
    if dist.is_initialized():
        dist.destroy_process_group()
    path = write_json(result_path("gpu", "cuda", args.out), result)
    report(result)
    print(f"wrote {path} ({result['wall_s']:.0f} s)")


def report(result: dict) -> None:
    if "nccl_allreduce" in result:
        print_table(f"NCCL all-reduce, world size 1, {result.get('gpu')}", ["size", "time", "GB/s"],
                    [[r["size"], fmt_time(r["nccl_s"]), f"{r['nccl_GBps']:.1f}"] for r in result["nccl_allreduce"]])
    rows = []
    if "loop" in result:
        lp = result["loop"]
        rows.append(["MLP 64-256-256-10 loop (bench_loop)", fmt_time(lp["raw_step_s"]), fmt_time(lp["fw_step_s"]),
                     f"{lp['ratio_fw_over_raw']:.4f}", f"{lp['overhead_us_per_step']:+.1f}"])
    st = result.get("strategies", {}).get("step_s", {})
    for k in ("single", "ddp_nccl", "dp"):
        if f"raw_{k}" in st and f"fw_{k}" in st:
            raw, fwv = st[f"raw_{k}"], st[f"fw_{k}"]
            rows.append([f"{k} (MLP 64-512-512-10)", fmt_time(raw), fmt_time(fwv), f"{fwv / raw:.4f}", f"{(fwv - raw) * 1e6:+.1f}"])
    if rows:
        print_table(f"fw vs raw on {result.get('gpu')}", ["what", "raw step", "fw step", "fw/raw", "µs/step"], rows)
    for name, err in {**result["errors"], **result.get("strategies", {}).get("errors", {})}.items():
        print(f"error in {name}: {err}")


if __name__ == "__main__":
    main()
