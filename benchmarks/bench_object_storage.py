"""What a checkpoint saved to an S3 bucket costs a training step: the same ``ModelCheckpoint``
saves to local disk, to the bucket with the upload inside the save (``s3://``), and to the bucket
uploaded in the background (``Trainer(async_upload=True)``), side by side in one run.

Why: with checkpoints in object storage (pods and Ray workers have no shared disk) the upload
must not stall training; issue 50 asks that the asynchronous save leave training waiting no
longer than a local save.
Read: per side, the median time of a step without a save, and how much longer a step with a save
took (the wait for the checkpoint), median over the saves of ``--rounds`` fits; for the
asynchronous side also the wait at the fit's end for the last upload. The bucket is moto's S3
server on 127.0.0.1 (no network: the upload costs its serialisation, HTTP and moto's copy).
Time: about 2 minutes on 2 cores (a 50 MB checkpoint saved 4 times a fit, 3 rounds); ``--quick`` seconds.
Run: ``python benchmarks/run.py object_storage [--quick]`` (starts and stops the S3 server itself).

The model is ``--layers`` Linear layers of ``--width`` x ``--width`` with Adam (width 1024, 4
layers: 4.2 M parameters, a 50 MB checkpoint with Adam's moments), trained for ``--steps`` steps
on random data, saving every ``--every`` steps (``save_top_k=1``: each save also removes the
previous file). An upload slower than the steps between two saves makes the next save wait for
it: the background cannot hide more than that. The S3 server shares the machine's cores with
training, so on 2 cores an upload also slows the steps it overlaps. A callback timestamps every step's start; a step's time is the gap to the next,
so a save step's includes ModelCheckpoint's whole save. The sides take turns within each round.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import framework as fw
from framework.bench.common import fmt_time, machine_info, median, print_table, result_path, write_json
from framework.callbacks import ModelCheckpoint

SIDES = ("local", "s3", "s3_async")


class Wide(fw.TrainModule):
    def __init__(self, width: int, layers: int) -> None:
        super().__init__()
        self.net = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-4)


class StepClock(fw.Callback):
    """The start of every step, and the end of the fit's training (before it waits for uploads)."""

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.train_end = 0.0

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        self.starts.append(time.perf_counter())

    def on_train_end(self, trainer, module) -> None:
        self.train_end = time.perf_counter()


def start_s3() -> tuple[subprocess.Popen, str]:
    """moto's S3 server on a free port of 127.0.0.1 (its credentials are not checked)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    end = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=2):
                return server, endpoint
        except OSError:
            if time.monotonic() > end or server.poll() is not None:
                server.kill()
                raise SystemExit("moto's S3 server did not start (pip install 'moto[server]')") from None
            time.sleep(0.1)


def one_fit(side: str, root: str, args: argparse.Namespace, data: TensorDataset) -> dict:
    clock = StepClock()
    trainer = fw.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, max_steps=args.steps,
                         default_root_dir=root, async_upload=side == "s3_async",
                         callbacks=[ModelCheckpoint(every_n_train_steps=args.every, save_top_k=1), clock])
    torch.manual_seed(0)
    trainer.fit(Wide(args.width, args.layers), DataLoader(data, batch_size=32))
    fit_end = time.perf_counter()
    steps = [b - a for a, b in zip(clock.starts, clock.starts[1:], strict=False)]
    # step i (0-based) ends at global_step i + 1; ModelCheckpoint saves in that step's batch end
    saving = [t for i, t in enumerate(steps) if (i + 1) % args.every == 0]
    plain = [t for i, t in enumerate(steps) if (i + 1) % args.every != 0 and i > 0]
    return {"plain": plain, "saving": saving, "end_wait": fit_end - clock.train_end}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=41)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a small model, one round")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.quick:
        args.width, args.rounds, args.steps, args.every = 256, 1, 11, 5
    torch.set_num_threads(1)
    server, endpoint = start_s3()
    os.environ.update(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
                      AWS_DEFAULT_REGION="us-east-1")
    try:
        import s3fs

        s3fs.S3FileSystem().mkdir("fw-bench")
        g = torch.Generator().manual_seed(0)
        data = TensorDataset(torch.randn(32 * args.steps, args.width, generator=g),
                             torch.randn(32 * args.steps, args.width, generator=g))
        local = tempfile.mkdtemp(prefix="fw-bench-storage-")
        found: dict[str, dict[str, list[float]]] = {side: {"plain": [], "saving": [], "end_wait": []} for side in SIDES}
        for round_ in range(args.rounds):
            order = SIDES[round_ % len(SIDES):] + SIDES[:round_ % len(SIDES)]
            for side in order:
                root = f"{local}/{side}-{round_}" if side == "local" else f"s3://fw-bench/{side}-{round_}"
                got = one_fit(side, root, args, data)
                found[side]["plain"] += got["plain"]
                found[side]["saving"] += got["saving"]
                found[side]["end_wait"].append(got["end_wait"])
    finally:
        server.kill()
        server.wait(timeout=10)
    params = args.layers * (args.width * args.width + args.width)
    summary = {side: {"step_s": median(v["plain"]), "save_step_s": median(v["saving"]),
                      "wait_s": median(v["saving"]) - median(v["plain"]), "end_wait_s": median(v["end_wait"]),
                      "saves": len(v["saving"])} for side, v in found.items()}
    out = {"benchmark": "object_storage", **machine_info("cpu"), "parameters": params,
           "checkpoint_mb": round(params * 4 * 3 / 1e6, 1), "steps": args.steps, "every": args.every,
           "rounds": args.rounds, "server": "moto S3 on 127.0.0.1",
           "statistic": "medians over every save step (or plain step) of all rounds; wait = save step - plain step",
           "summary": summary, "raw": found}
    path = write_json(result_path("object_storage", "cpu", args.out), out)
    rows = [[side, fmt_time(s["step_s"]), fmt_time(s["save_step_s"]), fmt_time(s["wait_s"]), fmt_time(s["end_wait_s"]),
             str(s["saves"])] for side, s in summary.items()]
    print_table(f"A checkpoint save's cost to a step, {out['hardware']}",
                ["side", "step", "step with a save", "wait for the save", "wait at the fit's end", "saves"], rows,
                caption=f"{params / 1e6:.1f} M parameters with Adam (~{out['checkpoint_mb']} MB), a save every "
                        f"{args.every} steps; medians over {args.rounds} round(s)")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
