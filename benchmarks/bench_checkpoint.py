"""How long training waits for a checkpoint under FSDP: a sharded save (every rank writes its
shards), an asynchronous sharded save (``async_save=True``: the call returns once the tensors are
copied; the shards are written while training goes on) and a full-state save (gathered through
rank 0's CPU into one file), side by side in one run.

Why: under FSDP a save is the one moment training waits on the disk; this says which kind of
save to pick (the benchmarks page and the FSDP guide quote it).
Read: seconds each call blocks (the slowest rank), median of ``--repeats``; for the asynchronous
save also the seconds until the checkpoint was committed (under its name).
Time: about a minute on 2 cores (1.2 GB of model state saved 9 times); ``--width 512`` seconds.
Run: ``python benchmarks/run.py checkpoint [--width 512]`` (2 ranks under torchrun).

A model of ``--blocks`` blocks of two ``--width`` x ``4*width`` Linear layers (width 2048, 3
blocks: 101 M parameters; with AdamW 1.2 GB of model state) is sharded over the ranks and
trained for one step (so AdamW has its moments); then, inside the same fit, each kind of save
runs ``--repeats`` times through ``trainer.save_checkpoint``, the call users make. For each: the
time the call blocked (the slowest rank), and for the asynchronous save also the time until it
was committed. The kind is switched between saves on the fit's own strategy
(``state_dict_type``, ``async_save``): the same code path a recipe's setting selects.

Run::

    .venv/bin/python -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/bench_checkpoint.py
    .venv/bin/python -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/bench_checkpoint.py --width 512
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import framework as fw
from framework.bench.common import machine_info, median, print_table, result_path, write_json

#: the processes ``benchmarks/run.py`` starts this script in (under torchrun; ``--ranks`` overrides)
LAUNCH_RANKS = 2
KINDS = {"sharded": ("sharded", False), "sharded, async": ("sharded", True), "full (rank 0)": ("full", False)}


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


class Model(fw.TrainModule):
    def __init__(self, width: int, blocks: int) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(Block(width) for _ in range(blocks)))

    def training_step(self, batch, batch_idx):
        (x,) = batch
        return self.blocks(x).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


class TimeSaves(fw.Callback):
    """At the end of the one training step: each kind of save, ``repeats`` times."""

    def __init__(self, folder: Path, repeats: int) -> None:
        self.folder, self.repeats, self.times = folder, repeats, {kind: [] for kind in KINDS}
        self.committed: list[float] = []

    def on_train_end(self, trainer, module) -> None:
        strategy = trainer.strategy
        for repeat in range(self.repeats):
            for kind, (state_dict_type, async_save) in KINDS.items():
                strategy.state_dict_type, strategy.async_save = state_dict_type, async_save
                path = self.folder / f"{state_dict_type}{'-async' if async_save else ''}-{repeat}.ckpt"
                strategy.barrier("before the save")
                start = time.perf_counter()
                trainer.save_checkpoint(path)
                self.times[kind].append(_slowest(time.perf_counter() - start))
                if async_save:
                    _wait_until_committed(path)
                    self.committed.append(_slowest(time.perf_counter() - start))


def _wait_until_committed(path: Path, timeout: float = 600.0) -> None:
    """An asynchronous save is under its name only once committed (until then it is written under
    a partial name): wait for the name to appear, as a reader of the folder sees it."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} was not committed within {timeout:g} s")
        time.sleep(0.002)


def _slowest(seconds: float) -> float:
    value = torch.tensor(seconds, dtype=torch.float64)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return float(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="results folder (default benchmarks/results)")
    parser.add_argument("--dir", default=None, help="where the checkpoints go (default: a temporary folder)")
    args = parser.parse_args()
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "local")  # one folder for all ranks
    folder = Path(args.dir or os.path.join(tempfile.gettempdir(), f"fw-bench-checkpoint-{run_id}"))
    torch.manual_seed(0)
    model = Model(args.width, args.blocks)
    params = sum(p.numel() for p in model.parameters())
    timer = TimeSaves(folder, args.repeats)
    trainer = fw.Trainer(strategy={"name": "fsdp", "auto_wrap_policy": ["Block"]}, devices=2, accelerator="cpu",
                         max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, callbacks=[timer])
    trainer.fit(model, DataLoader(TensorDataset(torch.randn(4, args.width)), batch_size=2))
    if trainer.global_rank != 0:
        return
    shutil.rmtree(folder, ignore_errors=True) if args.dir is None else None
    state_gb = params * 4 * 3 / 1e9  # float32 parameters and AdamW's two moments
    rows = [[kind, f"{median(times):.2f} s", f"{min(times):.2f}-{max(times):.2f} s"] for kind, times in timer.times.items()]
    rows.append(["sharded, async: until committed", f"{median(timer.committed):.2f} s",
                 f"{min(timer.committed):.2f}-{max(timer.committed):.2f} s"])
    print_table(f"training blocked by trainer.save_checkpoint, FSDP on 2 ranks: {params / 1e6:.0f} M parameters, "
                f"{state_gb:.2f} GB with AdamW", ["save", "median", "range"], rows,
                caption=f"{args.repeats} saves of each kind, the slowest rank each time")
    result = {**machine_info(), "parameters": params, "state_gb": state_gb, "repeats": args.repeats,
              "blocked_s": timer.times, "async_committed_s": timer.committed}
    print(f"wrote {write_json(result_path('checkpoint_fsdp2', out=args.out), result)}")


if __name__ == "__main__":
    main()
