"""The same 2-process DDP fit under each launcher: fw's own, torchrun, srun and mpiexec.

Why: how a job is started changes its threads per process and so its speed; this checks that
no launcher is left slow.
Read: the median step per launcher; the forced old srun behaviour shows what fw's thread
setting saves.
Time: about 2 minutes on 2 cores; ``--quick`` under a minute (launchers not installed are skipped).
Run: ``python benchmarks/run.py launchers [--quick]``.

Under srun and mpiexec every task used to keep all the cores' threads, and two tasks on two
cores ran many times slower per step than under torchrun (which sets OMP_NUM_THREADS=1). fw now
gives each process its share of the cores (its distributed strategies set the threads); this
measures the step time under each launcher side by side, in rounds that alternate the order,
and also srun with the old behaviour forced (``OMP_NUM_THREADS`` = all cores) for comparison.

    .venv/bin/python benchmarks/bench_launchers.py            # ~2 minutes on 2 cores
    .venv/bin/python benchmarks/bench_launchers.py --quick

What is timed: training epochs after the first (a callback reads the clock at each epoch's
start and end); the step time is the median over epochs and rounds, per launcher.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from framework.bench.common import machine_info, median, print_table, result_path, write_json

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

JOB = """
import json, os, sys, time, torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
import framework as fw

class Net(fw.TrainModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 1))
    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)

class Timer(fw.Callback):
    def __init__(self):
        self.times = []
    def on_train_epoch_start(self, trainer, module):
        self.start = time.perf_counter()
    def on_train_epoch_end(self, trainer, module):
        self.times.append((time.perf_counter() - self.start) / trainer.num_training_batches)

timer = Timer()
g = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(4096, 256, generator=g), torch.randn(4096, 1, generator=g))
trainer = fw.Trainer(accelerator="cpu", devices=2, strategy=sys.argv[2], max_epochs=int(sys.argv[3]), logger=False,
                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                     callbacks=[timer])
trainer.fit(Net(), DataLoader(data, batch_size=64))
if trainer.is_global_zero:
    with open(sys.argv[1], "w") as f:
        json.dump({"step_s": timer.times[1:], "threads": torch.get_num_threads()}, f)
"""


def launchers(epochs: int) -> dict[str, tuple[list[str], dict[str, str]]]:
    """name -> (command prefix, extra environment); only the launchers this machine has."""
    cores = str(os.cpu_count() or 1)
    found = {"fw": ([sys.executable], {}),
             "torchrun": ([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"], {})}
    if shutil.which("srun") and subprocess.run(["sinfo", "-h"], capture_output=True).returncode == 0:
        found["srun"] = (["srun", "-N1", "-n2", "--time=5", sys.executable], {})
        found[f"srun, OMP_NUM_THREADS={cores} (before)"] = (["srun", "-N1", "-n2", "--time=5", sys.executable],
                                                           {"OMP_NUM_THREADS": cores})
    if (BIN / "mpiexec").exists():
        found["mpiexec (mpi strategy)"] = ([str(BIN / "mpiexec"), "-n", "2", sys.executable], {})
    return found


def run_once(prefix: list[str], extra: dict[str, str], strategy: str, epochs: int, work: Path) -> dict:
    script, out = work / "job.py", work / f"out-{time.monotonic_ns()}.json"
    script.write_text(JOB)
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env.update(extra, PYTHONPATH=str(ROOT))
    subprocess.run([*prefix, str(script), str(out), strategy, str(epochs)], env=env, check=True, timeout=600,
                   capture_output=True, cwd=work)
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=4, help="epochs per run (the first is warm-up)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.epochs = 1, 2
    found = launchers(args.epochs)
    samples: dict[str, list[float]] = {name: [] for name in found}
    threads: dict[str, int] = {}
    wall = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            names = list(found) if r % 2 == 0 else list(reversed(found))
            for name in names:
                prefix, extra = found[name]
                strategy = "mpi" if name.startswith("mpiexec") else "ddp_gloo"
                got = run_once(prefix, extra, strategy, args.epochs, Path(tmp))
                samples[name] += got["step_s"]
                threads[name] = got["threads"]
    wall = time.perf_counter() - wall
    medians = {name: median(values) for name, values in samples.items()}
    reference = medians["torchrun"]
    result = {"benchmark": "launchers", **machine_info("cpu"), "model": "MLP 256-512-1, batch 64 per process",
              "processes": 2, "rounds": args.rounds, "epochs_per_run": args.epochs,
              "statistic": "median over epochs (first of each run dropped) of epoch time / batches",
              "step_s": medians, "threads_per_process": threads, "ratio_to_torchrun":
              {name: value / reference for name, value in medians.items()}, "samples_step_s": samples,
              "wall_s": wall}
    path = write_json(result_path("launchers", "cpu", args.out), result)
    print_table("the same 2-process DDP fit under each launcher", ["launcher", "threads/process", "median step",
                "vs torchrun"], [[name, threads[name], f"{medians[name] * 1e3:.2f} ms",
                                  f"{medians[name] / reference:.2f}x"] for name in found],
                caption=f"{args.rounds} rounds x {args.epochs - 1} timed epochs each")
    print(f"wrote {path} ({wall:.0f} s)")


if __name__ == "__main__":
    main()
