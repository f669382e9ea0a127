"""A small causal language model with standard transformer blocks, and one fit of it, for the
``model_parallel`` tests: the test process runs the one-process reference, the ranks of a job
the tensor-parallel (and 2-D) side."""

from __future__ import annotations

import io
from contextlib import redirect_stderr
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import framework as fw

VOCAB, WIDTH, HEADS, CONTEXT = 32, 16, 4, 8
STEPS, GLOBAL_BATCH = 12, 8
CHECKPOINT_EVERY = 6  # a mid-epoch checkpoint at step 6 of 12
QUIET = dict(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
             num_sanity_val_steps=0, max_epochs=-1)


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.n_head = HEADS
        self.q, self.k, self.v = (nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(3))
        self.o = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time, _ = x.shape
        q, k, v = (f(x).view(batch, time, self.n_head, -1).transpose(1, 2) for f in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(batch, time, -1))


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc, self.proj = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.attn, self.ln2, self.mlp = nn.LayerNorm(WIDTH), Attention(), nn.LayerNorm(WIDTH), MLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb, self.pos = nn.Embedding(VOCAB, WIDTH), nn.Embedding(CONTEXT, WIDTH)
        self.blocks = nn.Sequential(Block(), Block())
        self.norm, self.head = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        return self.head(self.norm(self.blocks(x)))


class LM(fw.TrainModule):
    def __init__(self, loss_parallel: bool = False, optimizer: str = "adamw", sequence_parallel: bool = False,
                 mlp_norm: bool = True) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.model = TinyLM()
        if not mlp_norm:  # the MLP sees the residual stream itself (under sequence parallel: this rank's part)
            for block in self.model.blocks:
                block.ln2 = nn.Identity()
        self.loss_parallel, self.optimizer, self.sequence_parallel = loss_parallel, optimizer, sequence_parallel
        self.saved_bytes = 0  # the most bytes a training step's forward kept for its backward
        self.norm_tokens = 0  # model_parallel: the most tokens of a sequence that a block's first norm saw
        self.norm_tokens_counted = False

    def _count_tokens(self, module: nn.Module, args: tuple) -> None:
        if torch.compiler.is_compiling():  # compiled runs do not count: the count would guard the blocks'
            return  # graph, each new value one more compile (the tensor-parallel case: 4 graphs a rank -> 3)
        self.norm_tokens = max(self.norm_tokens, args[0].shape[1])

    def configure_model(self) -> None:
        if self.device_mesh is not None:
            if not self.norm_tokens_counted:  # once per module, before the split's hooks
                for block in self.model.blocks:  # all alike: compiled, the blocks share graphs
                    block.ln1.register_forward_pre_hook(self._count_tokens)
                self.norm_tokens_counted = True
            fw.parallel.parallelize(self.model, self.device_mesh, blocks={Block}, loss_parallel=self.loss_parallel,
                                    sequence_parallel=self.sequence_parallel)

    def loss(self, batch) -> torch.Tensor:
        tokens, targets = batch
        return F.cross_entropy(self.model(tokens).flatten(0, 1), targets.flatten())

    def training_step(self, batch, batch_idx):
        saved = [0]

        def keep(tensor: torch.Tensor) -> torch.Tensor:  # what autograd keeps (a checkpointed block: its input)
            local = tensor.to_local() if hasattr(tensor, "to_local") else tensor  # a DTensor: this rank's part
            saved[0] += local.numel() * local.element_size()
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor):
            loss = self.loss(batch)
        self.saved_bytes = max(self.saved_bytes, saved[0])
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self.loss(batch), sync_dist=True)
        self.log("val_tokens", float(batch[0].numel()), reduce_fx="sum", sync_dist=True)

    def predict_step(self, batch, batch_idx):
        return self.model(batch[0])

    def configure_optimizers(self):
        if self.optimizer == "sgd":
            return torch.optim.SGD(self.parameters(), lr=0.1)
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def data(n: int = STEPS * GLOBAL_BATCH) -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (n, CONTEXT + 1), generator=g)
    return TensorDataset(tokens[:, :-1], tokens[:, 1:])


class FullWeights(fw.Callback):
    """At the fit's end, while the group is up: every rank gathers the full parameters; and the
    batches this fit trained (a resumed fit trains only those after its checkpoint)."""

    def __init__(self) -> None:
        self.weights: dict[str, torch.Tensor] = {}
        self.batches = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.batches += 1

    def on_fit_end(self, trainer, pl_module) -> None:
        self.weights = {name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().cpu().clone()
                        for name, p in pl_module.named_parameters()}


def fit(strategy: Any, devices: int, data_parallel: int = 1, max_steps: int = STEPS, loss_parallel: bool = False,
        optimizer: str = "adamw", callbacks: list | None = None, ckpt_path: str | None = None, root: str = ".",
        sequence_parallel: bool = False, mlp_norm: bool = True, **trainer_args: Any) -> dict:
    """One fit with the global batch split over ``data_parallel`` replicas: the full weights,
    the validation values, the step."""
    weights = FullWeights()
    trainer = fw.Trainer(**{**QUIET, "enable_checkpointing": bool(callbacks), **trainer_args}, strategy=strategy,
                         devices=devices, max_steps=max_steps, callbacks=[weights, *(callbacks or [])],
                         default_root_dir=root, val_check_interval=CHECKPOINT_EVERY)
    per_rank = GLOBAL_BATCH // data_parallel
    model = LM(loss_parallel, optimizer, sequence_parallel, mlp_norm)
    with redirect_stderr(io.StringIO()):
        trainer.fit(model, DataLoader(data(), batch_size=per_rank, shuffle=True),
                    DataLoader(data(20), batch_size=per_rank), ckpt_path=ckpt_path)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    return {"weights": weights.weights, "metrics": metrics, "global_step": trainer.global_step,
            "rank": trainer.global_rank, "batches": weights.batches, "saved_bytes": model.saved_bytes,
            "norm_tokens": model.norm_tokens}


def plan_by_hand(model: TinyLM, tp: Any, sequence_parallel: bool = False) -> None:
    """Megatron's plan on ``TinyLM`` written out with torch's styles, as Lightning's tensor-parallel
    example writes it (and torchtitan's ``parallelize_llama`` for the sequence split), not by
    ``fw.parallel``: the Lightning side of the comparison."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    between = Shard(1) if sequence_parallel else Replicate()
    for block in model.blocks:
        block.attn.n_head //= tp.size()
        plan: dict[str, Any] = {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
                                "attn.o": RowwiseParallel(output_layouts=between), "mlp.fc": ColwiseParallel(),
                                "mlp.proj": RowwiseParallel(output_layouts=between)}
        if sequence_parallel:
            gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
            plan.update({"ln1": SequenceParallel(), "attn": gather, "ln2": SequenceParallel(), "mlp": gather})
        parallelize_module(block, tp, plan)
    if sequence_parallel:
        parallelize_module(model.blocks, tp, {
            "0": PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),),
                                    use_local_output=True),
            str(len(model.blocks) - 1): PrepareModuleOutput(output_layouts=Shard(1), desired_output_layouts=Replicate())})


def lightning_fit(devices: int, tensor_parallel: int, optimizer: str = "adamw", sequence_parallel: bool = False,
                  root: str = ".") -> dict:
    """The tensor-parallel fit under Lightning's ``ModelParallelStrategy`` (its ``configure_model``
    applying ``plan_by_hand``): the full weights and the last train_loss, as ``fit`` returns them."""
    import pytorch_lightning as pl
    from pytorch_lightning.strategies import ModelParallelStrategy

    class LightningLM(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.model = TinyLM()
            self.weights: dict[str, torch.Tensor] = {}

        def configure_model(self) -> None:
            plan_by_hand(self.model, self.device_mesh["tensor_parallel"], sequence_parallel)

        def training_step(self, batch, batch_idx):
            tokens, targets = batch
            loss = F.cross_entropy(self.model(tokens).flatten(0, 1), targets.flatten())
            self.log("train_loss", loss, sync_dist=True)
            return loss

        def on_train_end(self) -> None:
            self.weights = {name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().cpu().clone()
                            for name, p in self.named_parameters()}

        configure_optimizers = LM.configure_optimizers
        optimizer = None

    LightningLM.optimizer = optimizer
    strategy = ModelParallelStrategy(data_parallel_size=devices // tensor_parallel, tensor_parallel_size=tensor_parallel)
    trainer = pl.Trainer(**{k: v for k, v in QUIET.items() if k != "max_epochs"}, enable_checkpointing=False,
                         devices=devices, strategy=strategy, max_steps=STEPS, limit_val_batches=0,
                         default_root_dir=root)
    model = LightningLM()
    with redirect_stderr(io.StringIO()):
        trainer.fit(model, DataLoader(data(), batch_size=GLOBAL_BATCH * tensor_parallel // devices, shuffle=True))
    return {"weights": model.weights, "metrics": {k: float(v) for k, v in trainer.callback_metrics.items()},
            "global_step": trainer.global_step, "rank": trainer.global_rank}
