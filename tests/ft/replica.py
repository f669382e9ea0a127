"""One replica group of the fault-tolerance tests (or the plain DDP run they compare with), as a
program: ``python replica.py OUT --replica R --groups G [--kill-at STEP] [--ddp]``.

A small MLP with Adam on a fixed synthetic data set, ``trainer.strategy=ft``. Every batch start
appends ``global_step epoch batch hash`` to ``OUT/steps-R-RANK.txt`` (the hash covers the weights,
the optimizer state and the position; under ``--fsdp`` this rank's shards of them), so that a test compares a healed replica with its peer at
the step it joined. At the end the parameters go to ``OUT/params-R-RANK.pt`` (gathered whole under ``--fsdp``). ``--kill-at STEP``:
the process SIGKILLs itself (every rank of the group) when that step starts; ``--wait-at STEP
--wait-for FILE``: a survivor waits at that step until a restarted replica made FILE
(``--announce FILE``, when its Manager is up and it is about to join), so that it comes back
before the survivor is done.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import framework as fw


def state_hash(module: torch.nn.Module, optimizer: torch.optim.Optimizer, *position: int) -> str:
    h = hashlib.sha256(repr(position).encode())
    for tensor in module.state_dict().values():
        h.update(_local(tensor).detach().cpu().contiguous().numpy().tobytes())
    for state in optimizer.state_dict()["state"].values():
        for value in state.values():
            h.update(_local(value).cpu().contiguous().numpy().tobytes() if torch.is_tensor(value) else repr(value).encode())
    return h.hexdigest()[:16]


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """--fsdp: this rank's shard of a DTensor (the hash covers each rank's own shards)."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """--fsdp: the whole tensor, gathered from the group's shards."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


class Net(fw.TrainModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.01)

    batch_size = 4  # --batch-size

    def train_dataloader(self):
        return data(batch_size=self.batch_size)


class RoutedNet(Net):
    """``--model routed``: a BatchNorm (buffers that each replica updates from its own share) and
    two heads, one chosen per batch by its first sample: a head unused on one replica at a step
    gets no gradient there."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Tanh())
        self.heads = nn.ModuleList([nn.Linear(16, 1), nn.Linear(16, 1)])

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self.heads[int(x[0, 0] > 0)](self.net(x)), y)


class Record(fw.Callback):
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args

    def _file(self, kind: str, trainer) -> str:
        return os.path.join(self.args.out, f"{kind}-{self.args.replica}-{trainer.global_rank}{self.args.tag}")

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        step, args = trainer.global_step, self.args
        if args.kill_at is not None and step == args.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if args.wait_at is not None and step == args.wait_at:  # the survivor waits for the restarted replica
            while not os.path.exists(os.path.join(args.out, args.wait_for)):
                time.sleep(0.05)
        digest = state_hash(module, trainer.optimizers[0], step, trainer.current_epoch, batch_idx)
        with open(self._file("steps", trainer) + ".txt", "a") as f:
            f.write(f"{step} {trainer.current_epoch} {batch_idx} {digest}\n")

    def on_train_end(self, trainer, module):
        torch.save({k: _full(v).detach().clone() for k, v in module.state_dict().items()}, self._file("params", trainer) + ".pt")


class StopAt(fw.Callback):
    """``--stop-at STEP``: this replica alone asks to stop (``trainer.should_stop``) once STEP steps are done."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            trainer.should_stop = True


def announce_at_the_join(path: str) -> None:
    """Make ``path`` when this replica's Manager is up (it heartbeats to the Lighthouse, so that the
    survivor's next quorum waits for it) and its first quorum is about to be asked for."""
    from framework.strategies.ft.replicas import Replicas

    join = Replicas.join

    def announced(self, *args, **kwargs):
        open(path, "w").close()
        return join(self, *args, **kwargs)

    Replicas.join = announced


def fail_commit_at(step: int) -> None:
    """This replica's commit of ``step`` fails after its all-reduce (as after a local error), while
    its peers commit it: it falls one step behind and takes a peer's state at its next step."""
    from framework.strategies.ft.replicas import Replicas

    join = Replicas.join

    def joined(self, *args, **kwargs):
        received = join(self, *args, **kwargs)
        should_commit = self.manager.should_commit

        def failing(*a, **k):
            if self.manager.current_step() == step:
                self.manager.report_error(RuntimeError(f"injected: commit of step {step} fails"))
            return should_commit(*a, **k)

        self.manager.should_commit = failing
        return received

    Replicas.join = joined


def data(n: int = 96, batch_size: int = 4) -> DataLoader:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 8, generator=g)
    y = x.sum(dim=1, keepdim=True).sin() + 0.1 * torch.randn(n, 1, generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--replica", type=int, default=0)
    p.add_argument("--groups", type=int, default=2)
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=30)
    p.add_argument("--kill-at", type=int, default=None)
    p.add_argument("--ddp", action="store_true", help="plain DDP over --devices ranks instead")
    p.add_argument("--fsdp", action="store_true", help="FSDP inside the group (ft_fsdp; with --ddp: plain fsdp)")
    p.add_argument("--batch-size", type=int, default=4, help="per rank")
    p.add_argument("--every", type=int, default=0, help="a checkpoint every N steps")
    p.add_argument("--ckpt-path", default=None)
    p.add_argument("--tag", default="", help="added to the names of the files this run writes")
    p.add_argument("--announce", default=None, help="a file made when the replica is about to join")
    p.add_argument("--wait-at", type=int, default=None, help="at this step, wait until --wait-for exists")
    p.add_argument("--wait-for", default=None)
    p.add_argument("--fail-commit-at", type=int, default=None, help="this replica's commit of that step fails")
    p.add_argument("--accumulate", type=int, default=1, help="accumulate_grad_batches")
    p.add_argument("--model", choices=["mlp", "routed"], default="mlp")
    p.add_argument("--timeout", type=float, default=60, help="trainer.strategy.timeout (the start's wait)")
    p.add_argument("--stop-at", type=int, default=None, help="this replica alone asks to stop after that step")
    args = p.parse_args()
    if args.announce:
        announce_at_the_join(os.path.join(args.out, args.announce))
    if args.fail_commit_at is not None:
        fail_commit_at(args.fail_commit_at)
    fw.seed_everything(0)
    if args.ddp:
        strategy = "fsdp" if args.fsdp else "ddp_gloo"
    elif args.fsdp:
        strategy = {"name": "ft_fsdp", "replica_id": args.replica, "num_replica_groups": args.groups,
                    "lighthouse": os.environ["TORCHFT_LIGHTHOUSE"], "timeout": args.timeout}
    else:
        strategy = {"name": "ft", "replica_id": args.replica, "num_replica_groups": args.groups,
                    "lighthouse": os.environ["TORCHFT_LIGHTHOUSE"], "timeout": args.timeout,
                    "find_unused_parameters": args.model == "routed"}
    callbacks: list = [Record(args)]
    callbacks += [StopAt(args.stop_at)] if args.stop_at is not None else []
    if args.every:
        callbacks.append(fw.callbacks.ModelCheckpoint(dirpath=os.path.join(args.out, f"ckpt-{args.replica}"),
                                                      every_n_train_steps=args.every, save_top_k=-1))
    trainer = fw.Trainer(accelerator="cpu", devices=args.devices, strategy=strategy, max_steps=args.max_steps,
                         logger=False, enable_checkpointing=bool(args.every), enable_progress_bar=False,
                         callbacks=callbacks, num_sanity_val_steps=0, accumulate_grad_batches=args.accumulate,
                         default_root_dir=os.path.join(args.out, f"root-{args.replica}"))
    module = RoutedNet() if args.model == "routed" else Net()
    module.batch_size = args.batch_size
    trainer.fit(module, ckpt_path=args.ckpt_path)
    print(f"replica {args.replica} done at step {trainer.global_step}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
