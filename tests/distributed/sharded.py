"""A model with blocks to shard, and one fit of it, for the FSDP tests: the test process runs the
one-process reference with it, the ranks of a job run the FSDP side (``fit`` below, either way)."""

from __future__ import annotations

import contextlib
import io
from contextlib import redirect_stderr
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import framework as fw

STEPS = 20  # AdamW steps per fit
GLOBAL_BATCH = 16
QUIET = dict(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
             num_sanity_val_steps=1, max_epochs=-1)  # the sanity check: evaluation before training


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.linear(x))


class Blocks(fw.TrainModule):
    """Parameters at the root (``inp``, ``head``) and in two ``Block`` units."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(8, width)
        self.blocks = nn.Sequential(Block(width), Block(width))
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.inp(x))).squeeze(-1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.mse_loss(self(x), y), sync_dist=True)

    def predict_step(self, batch, batch_idx):
        x, _ = batch
        return torch.cat([x, self(x)[:, None]], dim=1)  # the inputs beside the output: no index needed

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


class ManualBlocks(Blocks):
    """The same steps, written with manual optimization."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        x, y = batch
        loss = F.mse_loss(self(x), y)
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()
        return loss


class MetricBlocks(Blocks):
    """The same steps, with a torchmetrics metric in validation (its state synced over the ranks)."""

    def __init__(self) -> None:
        super().__init__()
        import torchmetrics

        self.val_mae = torchmetrics.MeanAbsoluteError()

    def validation_step(self, batch, batch_idx):
        super().validation_step(batch, batch_idx)
        x, y = batch
        self.val_mae(self(x), y)
        self.log("val_mae", self.val_mae)


class RoutedBlocks(Blocks):
    """A second head, and each rank's steps through one head only (rank r: head r), so that at
    every step each head is used on one rank and unused on the other (a routed model)."""

    def __init__(self) -> None:
        super().__init__()
        self.other_head = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        head = self.other_head if self.trainer.global_rank == 1 and self.training else self.head
        return head(self.blocks(self.inp(x))).squeeze(-1)


def data(n: int = STEPS * GLOBAL_BATCH) -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 8, generator=g)
    return TensorDataset(x, x.sum(dim=1).sin() + 0.1 * torch.randn(n, generator=g))


class FullWeights(fw.Callback):
    """At the fit's end, while the group is up: every rank gathers the full parameters."""

    def __init__(self) -> None:
        self.weights: dict[str, torch.Tensor] = {}
        self.local_numel = 0  # the parameter elements this rank holds
        self.sharded = False  # every parameter a DTensor after the first batch
        self.sharded_at_end = False  # ... and at the fit's end (after its last validation)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not self.local_numel:  # the fit's first batch (after a backward FSDP holds only the shards)
            params = list(pl_module.parameters())
            self.local_numel = sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in params)
            self.sharded = all(hasattr(p, "to_local") for p in params)

    def on_fit_end(self, trainer, pl_module) -> None:
        self.sharded_at_end = all(hasattr(p, "to_local") for p in pl_module.parameters())
        self.weights = {name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().cpu().clone()
                        for name, p in pl_module.named_parameters()}


def fit(strategy: Any, devices: int, max_steps: int = STEPS, callbacks: list | None = None,
        ckpt_path: str | None = None, root: str = ".", manual: bool = False, predict: bool = False,
        samples: int = STEPS * GLOBAL_BATCH, shuffle: bool = False, meta: bool = False, metric: bool = False,
        routed: bool = False, **trainer_args: Any) -> dict:
    """One fit on ``devices`` ranks with the global batch split over them (``manual``: with
    manual optimization); the full weights, the epoch's validation loss, the trainer's step, and
    with ``predict`` this rank's predictions on the validation data (rows: inputs, output).
    ``shuffle``: the training loader shuffles (fw's one order: the same on any number of ranks);
    ``meta``: the model is built under ``trainer.init_module()``; ``metric``: with a torchmetrics
    metric (``val_mae``); ``routed``: ``RoutedBlocks`` (its run depends on the ranks)."""
    weights = FullWeights()
    trainer = fw.Trainer(**{**QUIET, "enable_checkpointing": bool(callbacks), **trainer_args}, strategy=strategy,
                         devices=devices, max_steps=max_steps, callbacks=[weights, *(callbacks or [])],
                         default_root_dir=root)
    per_rank = GLOBAL_BATCH // devices
    with trainer.init_module() if meta else contextlib.nullcontext():  # fsdp: on the meta device
        model = ManualBlocks() if manual else MetricBlocks() if metric else RoutedBlocks() if routed else Blocks()
    built_on_meta = all(p.is_meta for p in model.parameters())
    if meta:
        torch.rand(3)  # a draw between building and fitting: the initialisation is not made from it
    with redirect_stderr(io.StringIO()):
        trainer.fit(model, DataLoader(data(samples), batch_size=per_rank, shuffle=shuffle),
                    DataLoader(data(64), batch_size=per_rank), ckpt_path=ckpt_path)
        val_loss = float(trainer.callback_metrics.get("val_loss", torch.nan))  # a call starts with none
        val_mae = float(trainer.callback_metrics.get("val_mae", torch.nan))
        predictions = trainer.predict(model, DataLoader(data(64), batch_size=per_rank)) if predict else None
    return {"weights": weights.weights, "val_loss": val_loss, "val_mae": val_mae,
            "global_step": trainer.global_step, "rank": trainer.global_rank,
            "local_numel": weights.local_numel, "sharded": weights.sharded, "sharded_at_end": weights.sharded_at_end,
            "built_on_meta": built_on_meta,
            "predictions": torch.cat(predictions) if predictions else None}
