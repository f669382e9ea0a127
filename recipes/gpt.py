"""A byte-level GPT trained on the Python standard library's own source files, which every
Python install that runs fw carries (``sysconfig.get_paths()["stdlib"]``): real text, no download.

``PythonSource`` reads the ``.py`` files in sorted order, holds every 20th file out for validation,
and caches the bytes once (``~/.cache/fw/python_source``); a sample is ``context + 1`` bytes, the
model reads the first ``context`` and predicts the next byte at each position. ``GPT`` is a
pre-norm decoder of standard blocks (separate q/k/v, ``scaled_dot_product_attention`` with a causal
mask, a GELU MLP), so ``fw.parallel.parallelize`` splits them for ``model_parallel``; predict
continues the data module's prompt and returns the text. Recipes: ``conf/gpt/*.yaml``.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import sys
import sysconfig
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

import framework as fw

VOCAB = 256  # bytes


# -- data ---------------------------------------------------------------------------------------
@functools.cache
def stdlib_files() -> list[Path]:
    """The standard library's ``.py`` files, in a fixed order (installed packages left out: their
    folders are not walked, which took most of the time where they are many); listed once a
    process (prepare_data and setup both read the corpus)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [d for d in subfolders if d not in ("site-packages", "dist-packages")]
        found += [Path(folder, name) for name in names if name.endswith(".py")]
    files = sorted(found)
    if not files:
        raise fw.ConfigError(f"data: no .py files under {root} (this Python's standard library ships compiled "
                             "files only); point data.source at a folder of text files")
    return files


def read_corpus(source: str | None, max_bytes: int, cache_dir: str | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, validation) bytes as uint8 tensors, read once and cached by what they depend on."""
    files = sorted(Path(source).rglob("*.py")) if source else stdlib_files()
    key = hashlib.sha256(repr((sys.version, [str(f) for f in files], max_bytes)).encode()).hexdigest()[:16]
    cache = Path(cache_dir or os.path.join(os.path.expanduser("~"), ".cache", "fw", "python_source")) / f"{key}.pt"
    if cache.exists():
        saved = torch.load(cache, weights_only=True)
        return saved["train"], saved["val"]
    parts: dict[str, list[bytes]] = {"train": [], "val": []}
    size = 0
    for i, path in enumerate(files):
        text = path.read_bytes() + b"\n\n"
        parts["val" if i % 20 == 10 else "train"].append(text)
        size += len(text)
        if size >= max_bytes:
            break
    tensors = {k: torch.frombuffer(bytearray(b"".join(v)), dtype=torch.uint8).clone() for k, v in parts.items()}
    cache.parent.mkdir(parents=True, exist_ok=True)
    partial = cache.with_suffix(f".{os.getpid()}.partial")
    torch.save(tensors, partial)
    os.replace(partial, cache)  # several ranks may build it at once: each writes whole, the last rename wins
    return tensors["train"], tensors["val"]


class Windows(Dataset):
    """Non-overlapping windows of ``context + 1`` bytes: (input, the next byte at each position)."""

    def __init__(self, data: torch.Tensor, context: int) -> None:
        self.data, self.context = data, context

    def __len__(self) -> int:
        return (len(self.data) - 1) // self.context

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        chunk = self.data[i * self.context: (i + 1) * self.context + 1].long()
        return chunk[:-1], chunk[1:]


class PythonSource(fw.DataModule):
    """Byte windows of the standard library's source (or of ``source``'s ``.py`` files).

    Args:
        context: bytes the model reads per sample.
        batch_size: samples per device per step.
        max_bytes: how much of the text to read (the first files in order).
        prompt: what predict continues.
    """

    def __init__(self, context: int = 128, batch_size: int = 32, max_bytes: int = 4_000_000, prompt: str = "def ",
                 source: str | None = None, cache_dir: str | None = None, num_workers: int = 0) -> None:
        super().__init__()
        self.context, self.batch_size, self.max_bytes, self.prompt = context, batch_size, max_bytes, prompt
        self.source, self.cache_dir, self.num_workers = source, cache_dir, num_workers
        self.train: torch.Tensor | None = None
        self.val: torch.Tensor | None = None

    def prepare_data(self) -> None:
        read_corpus(self.source, self.max_bytes, self.cache_dir)  # once per node: the cache

    def setup(self, stage: str) -> None:
        self.train, self.val = read_corpus(self.source, self.max_bytes, self.cache_dir)

    def train_dataloader(self) -> DataLoader:
        assert self.train is not None, "setup() first"
        return DataLoader(Windows(self.train, self.context), batch_size=self.batch_size, shuffle=True,
                          num_workers=self.num_workers, drop_last=True)

    def val_dataloader(self) -> DataLoader:
        assert self.val is not None, "setup() first"
        return DataLoader(Windows(self.val, self.context), batch_size=self.batch_size, num_workers=self.num_workers)

    def predict_dataloader(self) -> DataLoader:
        prompt = torch.tensor(list(self.prompt.encode()), dtype=torch.long)
        return DataLoader([(prompt, prompt)], batch_size=1)


# -- model --------------------------------------------------------------------------------------
class Attention(nn.Module):
    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.n_head, self.dropout = heads, dropout
        self.q, self.k, self.v = (nn.Linear(width, width, bias=False) for _ in range(3))
        self.o = nn.Linear(width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time, _ = x.shape
        q, k, v = (f(x).view(batch, time, self.n_head, -1).transpose(1, 2) for f in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        return self.o(y.transpose(1, 2).reshape(batch, time, -1))


class MLP(nn.Module):
    def __init__(self, width: int, dropout: float) -> None:
        super().__init__()
        self.fc, self.proj, self.drop = nn.Linear(width, 4 * width), nn.Linear(4 * width, width), nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(width), Attention(width, heads, dropout)
        self.ln2, self.mlp = nn.LayerNorm(width), MLP(width, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Decoder(nn.Module):
    def __init__(self, context: int, width: int, layers: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, width), nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads, dropout) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, VOCAB, bias=False)
        self._init_weights(layers)

    def _init_weights(self, layers: int) -> None:
        for name, p in self.named_parameters():
            if p.dim() == 2:  # GPT-2's: N(0, 0.02), the residual projections scaled by depth
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(("o.weight", "proj.weight")) else 0.02
                nn.init.normal_(p, std=std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class GPT(fw.TrainModule):
    """Next-byte prediction; AdamW (decay on matrices only, fused on CUDA), linear warm-up then
    cosine decay to a tenth over ``trainer.max_steps``.

    Args:
        loss_parallel: under ``model_parallel``, split the head by vocabulary too.
        max_new_tokens, temperature: what predict generates.
    """

    def __init__(self, context: int = 128, width: int = 128, layers: int = 4, heads: int = 4, dropout: float = 0.0,
                 lr: float = 1e-3, weight_decay: float = 0.1, warmup_steps: int = 50, loss_parallel: bool = False,
                 max_new_tokens: int = 200, temperature: float = 0.8) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.model = Decoder(context, width, layers, heads, dropout)

    def configure_model(self) -> None:
        if self.device_mesh is not None:
            fw.parallel.parallelize(self.model, self.device_mesh, blocks={Block},
                                    loss_parallel=self.hparams.loss_parallel)

    def loss(self, batch) -> torch.Tensor:
        tokens, targets = batch
        return F.cross_entropy(self.model(tokens).flatten(0, 1), targets.flatten())

    def training_step(self, batch, batch_idx):
        loss = self.loss(batch)
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val/loss", self.loss(batch), prog_bar=True, sync_dist=True)

    @torch.no_grad()
    def predict_step(self, batch, batch_idx) -> str:
        tokens = batch[0][:1]
        for _ in range(self.hparams.max_new_tokens):
            logits = self.model(tokens[:, -self.hparams.context:])[:, -1]
            if hasattr(logits, "full_tensor"):  # split by vocabulary (loss parallel): every rank samples alike
                logits = logits.full_tensor()
            probs = F.softmax(logits.float() / self.hparams.temperature, dim=-1)
            tokens = torch.cat([tokens, torch.multinomial(probs, 1)], dim=1)
        return bytes(tokens[0].tolist()).decode("utf-8", errors="replace")

    def flops_per_token(self) -> float:
        """Training FLOPs per token: 6N + 12 L d T (the PaLM appendix estimate, as nanoGPT's MFU)."""
        h = self.hparams
        return 6 * sum(p.numel() for p in self.parameters()) + 12 * h.layers * h.width * h.context

    def configure_optimizers(self):
        decay = [p for p in self.parameters() if p.dim() >= 2]
        rest = [p for p in self.parameters() if p.dim() < 2]
        fused = {"fused": True} if next(self.parameters()).is_cuda else {}
        optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": self.hparams.weight_decay},
                                       {"params": rest, "weight_decay": 0.0}], lr=self.hparams.lr, betas=(0.9, 0.95),
                                      **fused)
        estimated = self.trainer.estimated_stepping_batches
        warmup = self.hparams.warmup_steps
        total = int(estimated) if math.isfinite(estimated) else 10**9

        def factor(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            progress = min(1.0, (step - warmup) / max(1, total - warmup))
            return 0.1 + 0.45 * (1 + math.cos(math.pi * progress))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
