"""A language model that ties its embedding and its head (``head.weight = emb.weight``, as a
GPT does), and one fit of it, for the FSDP tests of tied weights: the test process runs the
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

VOCAB, WIDTH, CONTEXT = 32, 16, 8
STEPS, GLOBAL_BATCH = 20, 16  # AdamW steps per fit, samples per step over all ranks
QUIET = dict(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False, max_epochs=-1)


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.linear(x))


def make_tied(Base: type) -> type:
    """The model on ``Base`` (fw's ``TrainModule`` or Lightning's ``LightningModule``)."""

    class TiedLM(Base):
        """Next-token prediction; the head's weight is the embedding's (one parameter, two names).
        ``manual``: two ``manual_backward`` a step (half the batch each), then ``clip_gradients``;
        ``head_made``: the embedding takes the head's weight (nanoGPT's way), so it has the head's
        initialisation."""

        def __init__(self, manual: bool = False, head_made: bool = False, in_configure_model: bool = False) -> None:
            super().__init__()
            self.head_made, self.in_configure_model = head_made, in_configure_model
            self.automatic_optimization = not manual
            if not in_configure_model:
                self.build()

        def configure_model(self) -> None:
            """``in_configure_model``: the layers are built here, on the meta device by the module itself."""
            if self.in_configure_model and not hasattr(self, "emb"):
                with torch.device("meta"):
                    self.build()

        def build(self) -> None:
            torch.manual_seed(0)
            self.emb = nn.Embedding(VOCAB, WIDTH)
            self.blocks = nn.Sequential(Block(WIDTH), Block(WIDTH))
            self.head = nn.Linear(WIDTH, VOCAB, bias=False)
            if self.head_made:
                self.emb.weight = self.head.weight
            else:
                self.head.weight = self.emb.weight

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            return self.head(self.blocks(self.emb(tokens)))

        def loss(self, tokens: torch.Tensor) -> torch.Tensor:
            logits = self(tokens[:, :-1])
            return F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))

        def training_step(self, batch, batch_idx):
            (tokens,) = batch
            if self.automatic_optimization:
                return self.loss(tokens)
            opt = self.optimizers()
            opt.zero_grad()
            half = len(tokens) // 2  # the gradients of both backwards add up, then are clipped
            self.manual_backward(self.loss(tokens[:half]) / 2)
            self.manual_backward(self.loss(tokens[half:]) / 2)
            self.clip_gradients(opt, gradient_clip_val=0.5, gradient_clip_algorithm="norm")
            opt.step()
            return None

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-2)

    return TiedLM


TiedLM = make_tied(fw.TrainModule)


def data(n: int = STEPS * GLOBAL_BATCH) -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    start = torch.randint(0, VOCAB, (n, 1), generator=g)
    return TensorDataset((start + torch.arange(CONTEXT + 1)) % VOCAB)  # each token the one before it plus 1


class FullState(fw.Callback):
    """At the fit's end, while the group is up: every rank gathers the full parameters and the
    optimizer's moments, by parameter name."""

    def __init__(self) -> None:
        self.initial: dict[str, torch.Tensor] = {}
        self.weights: dict[str, torch.Tensor] = {}
        self.moments: dict[str, torch.Tensor] = {}

    def on_train_start(self, trainer, pl_module) -> None:
        self.initial = {name: _full(p) for name, p in pl_module.named_parameters()}

    def on_fit_end(self, trainer, pl_module) -> None:
        full = _full
        state = trainer.optimizers[0].state
        for name, p in pl_module.named_parameters():
            self.weights[name] = full(p)
            for key in ("exp_avg", "exp_avg_sq"):
                self.moments[f"{name}.{key}"] = full(state[p][key])


def _full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().cpu().clone()


def fit(strategy: Any, devices: int, max_steps: int = STEPS, callbacks: list | None = None,
        ckpt_path: str | None = None, root: str = ".", manual: bool = False, meta: bool = False,
        head_made: bool = False, in_configure_model: bool = False, **trainer_args: Any) -> dict:
    """One fit on ``devices`` ranks with the global batch split over them: the full weights and
    optimizer moments by name, the trainer's step and rank, and the weights it started from
    (``meta``: built under ``trainer.init_module()``, on the meta device under fsdp;
    ``in_configure_model``: built on the meta device in the module's ``configure_model()``)."""
    state = FullState()
    trainer = fw.Trainer(**{**QUIET, "enable_checkpointing": bool(callbacks), "num_sanity_val_steps": 0,
                            **trainer_args}, strategy=strategy, devices=devices, max_steps=max_steps,
                         callbacks=[state, *(callbacks or [])], default_root_dir=root)
    with trainer.init_module() if meta else contextlib.nullcontext():
        model = TiedLM(manual=manual, head_made=head_made, in_configure_model=in_configure_model)
    tied = model.head.weight is model.emb.weight if hasattr(model, "emb") else None  # None: built in the fit
    with redirect_stderr(io.StringIO()):
        trainer.fit(model, DataLoader(data(), batch_size=GLOBAL_BATCH // devices), ckpt_path=ckpt_path)
    units = [name for name, m in model.named_modules() if type(m).__name__.startswith("FSDP")]  # fully_shard's
    return {"units": units, "initial": state.initial, "weights": state.weights, "moments": state.moments, "global_step": trainer.global_step,
            "rank": trainer.global_rank, "tied": tied, "still_tied": model.head.weight is model.emb.weight}
