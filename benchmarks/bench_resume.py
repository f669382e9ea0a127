"""How long a mid-epoch resume takes to reach its position, by position in the epoch.

Why: a resume mid-epoch must not cost in proportion to the batches already done.
Read: fw's time should stay flat over the positions, while draw-and-drop grows with them.
Time: about a minute on 2 cores; ``--quick`` a few seconds.
Run: ``python benchmarks/run.py resume [--quick]``.

A data set whose samples cost 0.25 ms each to load (a stand-in for decoding), 200 batches of 8
per epoch. A first run saves checkpoints at steps 0 (start), 50, 100, 150 and 199 of the epoch;
then for each, a new Trainer resumes from it and the time from the ``fit()`` call to the first
training step after the resume point is measured (median of R repeats). Two sides:

- ``fw``: fw's resume: a DataLoader skips the done batches by drawing their indices only;
- ``draw and drop``: the same loader behind a thin wrapper that hides it is a DataLoader, so the
  done batches are loaded and thrown away (what fw did before, and what it still does for
  iterable data sets).

Run::

    .venv/bin/python benchmarks/bench_resume.py            # ~1 minute on 2 CPU cores
    .venv/bin/python benchmarks/bench_resume.py --quick
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

import framework as fw
from framework.bench.common import fmt_time, machine_info, median, print_table, result_path, write_json
from framework.callbacks import ModelCheckpoint

BATCHES, BATCH = 200, 8
POSITIONS = (0, 50, 100, 150, 199)


class Slow(Dataset):
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(BATCHES * BATCH, 16, generator=g), torch.randn(BATCHES * BATCH, 1, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        end = time.perf_counter() + 0.00025
        while time.perf_counter() < end:
            pass
        return self.x[i], self.y[i]


class Hidden:
    """The same loader, but not a DataLoader as far as fw can tell."""

    def __init__(self, loader: DataLoader) -> None:
        self.loader = loader

    def __iter__(self):
        return iter(self.loader)

    def __len__(self) -> int:
        return len(self.loader)


class Net(fw.TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class FirstStep(fw.Callback):
    def __init__(self) -> None:
        self.at: float | None = None

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        if self.at is None:
            self.at = time.perf_counter()
            trainer.should_stop = True  # one step is enough


def trainer(root: str, callbacks: list, **kwargs) -> fw.Trainer:
    return fw.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, num_sanity_val_steps=0,
                      default_root_dir=root, callbacks=callbacks, **kwargs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    repeats = 1 if args.quick else args.repeats
    data = Slow()
    root = tempfile.mkdtemp(prefix="fw-bench-resume-")
    saver = ModelCheckpoint(dirpath=root, every_n_train_steps=1, save_top_k=-1, filename="{step}")
    trainer(root, [saver], max_epochs=1, enable_checkpointing=True).fit(Net(), DataLoader(data, batch_size=BATCH, shuffle=True))
    results: dict[str, dict[int, float]] = {"fw": {}, "draw_and_drop": {}}
    for position in POSITIONS:
        ckpt = f"{root}/step={position}.ckpt" if position else None
        for side in results:
            times = []
            for _ in range(repeats):
                first = FirstStep()
                loader = DataLoader(data, batch_size=BATCH, shuffle=True)
                start = time.perf_counter()
                trainer(root, [first], max_epochs=1, enable_checkpointing=False).fit(
                    Net(), loader if side == "fw" else Hidden(loader), ckpt_path=ckpt)
                times.append(first.at - start)
            results[side][position] = median(times)
    out = {
        "benchmark": "resume", **machine_info("cpu"), "batches_per_epoch": BATCHES, "batch": BATCH,
        "sample_load_s": 0.00025, "repeats": repeats,
        "statistic": "median over repeats of the time from fit() to the first training step after the resume point",
        "seconds_to_first_step": {side: {str(p): t for p, t in v.items()} for side, v in results.items()},
    }
    path = write_json(result_path("resume", "cpu", args.out), out)
    rows = [[str(p), fmt_time(results["fw"][p]), fmt_time(results["draw_and_drop"][p])] for p in POSITIONS]
    print_table(f"Resume: fit() to the first step after the resume point, {out['hardware']}",
                ["position (batches done)", "fw (indices only)", "draw and drop"], rows,
                caption=f"{BATCHES} batches of {BATCH}, 0.25 ms per sample; median of {repeats}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
