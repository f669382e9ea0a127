"""What the Ray Train tests train: the loop each Ray worker runs, and the same fit under fw's own launcher.

The test module registers this module with Ray's cloudpickle *by value*, so the workers need not
import it (they import only ``framework``, from this checkout: the cluster's ``PYTHONPATH``). The
reference script imports it by path (``python workload.py OUT``).

A linear-and-tanh regressor with AdamW on 96 shuffled samples, at a global batch of 16 whatever
the number of workers (16 // world size per rank): 6 steps an epoch, 12 in all. Each attempt's
rank 0 appends where it started to ``attempts.jsonl`` in the run's folder.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import framework as fw

GLOBAL_BATCH = 16
EPOCHS = 2
REPORT_EVERY = 2  # optimizer steps between two reports to Ray (mid-epoch checkpoints)


class Net(fw.TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        self.log("train/loss", loss, sync_dist=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=0.05)


def loader(world_size: int) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(96, 8, generator=g)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=GLOBAL_BATCH // world_size, shuffle=True)


class Attempts(fw.Callback):
    """Rank 0 notes each attempt: how many ranks, where it started, who launched it, the group."""

    def __init__(self, folder: str, group_before: bool) -> None:
        self.folder, self.group_before = folder, group_before

    def on_train_start(self, trainer, module) -> None:
        import torch.distributed as dist

        if trainer.global_rank == 0:
            row = {"world": trainer.world_size, "start_step": trainer.global_step,
                   "environment": trainer.environment.name, "strategy": trainer.strategy.name,
                   "group_before": self.group_before, "backend": dist.get_backend() if dist.is_initialized() else None,
                   "nodes_of_placement": trainer.environment._nodes_of_placement()}  # asked of Ray, not estimated
            with open(os.path.join(self.folder, "attempts.jsonl"), "a") as fp:
                fp.write(json.dumps(row) + "\n")


class KillAt(fw.Callback):
    """Rank 1 of the first attempt dies by SIGKILL after ``step`` optimizer steps (mid-epoch)."""

    def __init__(self, step: int, marker: str) -> None:
        self.step, self.marker = step, marker

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step and trainer.global_rank == 1 and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)


class HoldAt(fw.Callback):
    """On 2 ranks, after ``step`` steps, rank 0 asks the test (a marker file) to take a node away and
    every rank waits for it (at most 60 s, then the run goes on and the test fails)."""

    def __init__(self, step: int, marker: str) -> None:
        self.step, self.marker = step, marker

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step and trainer.world_size == 2 and not os.path.exists(self.marker + ".done"):
            if trainer.global_rank == 0:
                open(self.marker, "w").close()
            time.sleep(60)


def train_loop(config: dict) -> None:
    """``train_loop_per_worker``: what a user writes, plus the test's callbacks."""
    import ray.train
    import torch.distributed as dist

    group_before = dist.is_initialized()  # Ray made it: fw must use it
    world = ray.train.get_context().get_world_size()
    callbacks: list = [fw.callbacks.RayTrainReport(every_n_train_steps=REPORT_EVERY),
                       Attempts(config["folder"], group_before)]
    if config.get("kill_at"):
        callbacks.append(KillAt(config["kill_at"], os.path.join(config["folder"], "killed")))
    if config.get("hold_at"):
        callbacks.append(HoldAt(config["hold_at"], os.path.join(config["folder"], "hold")))
    if config.get("bad_argument"):
        fw.Trainer(gradient_clip_algorithm="sideways")
    fw.seed_everything(0)
    trainer = fw.Trainer(accelerator="cpu", max_epochs=EPOCHS, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks,
                         default_root_dir=config["folder"])
    trainer.fit(Net(), loader(world))
    if trainer.global_rank == 0:  # fw left Ray's group as it found it: Ray destroys it
        with open(os.path.join(config["folder"], f"group_after_attempt_{os.getpid()}"), "w") as fp:
            fp.write(str(dist.is_initialized()))


def fit_under_fws_launcher(out: str) -> None:
    """The same fit under fw's own launcher (2 processes, ddp): rank 0 saves the final weights."""
    fw.seed_everything(0)
    model = Net()
    trainer = fw.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=EPOCHS, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, loader(2))
    if trainer.global_rank == 0:
        torch.save(model.state_dict(), out)


if __name__ == "__main__":
    fit_under_fws_launcher(sys.argv[1])
