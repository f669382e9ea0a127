"""The training workloads of ``fw bench`` (recipes in ``conf/bench/``): a small ResNet-style CNN
on synthetic 32x32 images and a small GPT-style transformer on synthetic tokens (the digits MLP
is ``recipes.digits``). Each is also an ordinary recipe: ``fw fit conf/bench/cnn.yaml``.

Every module here keeps its network in ``net`` and its loss in ``criterion(output, target)``, and
its ``training_step`` is exactly ``criterion(self(x), y)``: the benchmark's hand-written loop
runs the same computation without fw. Nothing is logged per step (the hand-written loop logs
nothing either).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import framework as fw


class SyntheticData(fw.DataModule):
    """Random inputs and labels, fixed by ``seed`` (the same on every rank and every run).

    Args:
        kind: ``images`` (``[3, size, size]`` floats, 10 classes) or ``tokens`` (sequences of
            ``size + 1`` ids below ``vocab``; the target is the input shifted by one).
        num_samples: samples in the training set.
        batch_size: per device.
    """

    def __init__(self, kind: str = "images", num_samples: int = 2048, batch_size: int = 32, size: int = 32,
                 vocab: int = 256, seed: int = 0, shuffle: bool = False) -> None:
        if kind not in ("images", "tokens"):
            raise ValueError(f"data.kind={kind!r}: use images or tokens")
        self.kind, self.num_samples, self.batch_size, self.size = kind, num_samples, batch_size, size
        self.vocab, self.seed, self.shuffle = vocab, seed, shuffle

    def setup(self, stage: str) -> None:
        g = torch.Generator().manual_seed(self.seed)
        if self.kind == "images":
            x = torch.randn(self.num_samples, 3, self.size, self.size, generator=g)
            y = torch.randint(0, 10, (self.num_samples,), generator=g)
        else:
            seq = torch.randint(0, self.vocab, (self.num_samples, self.size + 1), generator=g)
            x, y = seq[:, :-1].contiguous(), seq[:, 1:].contiguous()
        self.train_set = TensorDataset(x, y)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=self.shuffle, drop_last=True)


class _Workload(fw.TrainModule):
    """``training_step`` is ``criterion(self(x), y)``; Adam (or AdamW) with a fixed rate."""

    lr, weight_decay = 1e-3, 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    @staticmethod
    def criterion(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return self.criterion(self(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=self.weight_decay)


class _Block(nn.Module):
    """conv-bn-relu-conv-bn plus the (projected) input, then relu."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
            nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout),
        )
        self.skip = nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.body(x) + self.skip(x))


class ResNetCNN(_Workload):
    """A small ResNet for 32x32 images: a stem, then ``blocks`` residual blocks per stage with
    the widths of ``widths`` (each stage after the first halves the resolution), pooling, a
    linear classifier."""

    def __init__(self, widths: tuple[int, ...] = (16, 32, 64), blocks: int = 1, classes: int = 10, lr: float = 1e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.lr = lr
        layers: list[nn.Module] = [nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU(inplace=True)]
        cin = widths[0]
        for i, width in enumerate(widths):
            for b in range(blocks):
                layers.append(_Block(cin, width, 2 if i > 0 and b == 0 else 1))
                cin = width
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
        self.net = nn.Sequential(*layers)


class _Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class _TransformerBlock(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(dim), _Attention(dim, heads)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class _GPT(nn.Module):
    def __init__(self, vocab: int, context: int, dim: int, layers: int, heads: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(context, dim)
        self.blocks = nn.Sequential(*[_TransformerBlock(dim, heads) for _ in range(layers)])
        self.ln, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        return self.head(self.ln(self.blocks(self.tok(idx) + self.pos(positions))))


class TinyGPT(_Workload):
    """A GPT-style decoder (pre-norm blocks, causal attention, learned positions) predicting
    the next token."""

    def __init__(self, vocab: int = 256, context: int = 64, dim: int = 128, layers: int = 2, heads: int = 4,
                 lr: float = 3e-4, weight_decay: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.lr, self.weight_decay = lr, weight_decay
        self.net = _GPT(vocab, context, dim, layers, heads)

    def flops_per_token(self) -> float:
        """Training FLOPs per token, 6N + 12 L d T (the PaLM appendix estimate, as nanoGPT's MFU)."""
        h = self.hparams
        n = sum(p.numel() for p in self.net.parameters()) - self.net.pos.weight.numel()
        return 6 * n + 12 * h["layers"] * h["dim"] * h["context"]


class DigitsMLP(_Workload):
    """The digits MLP of ``conf/digits.yaml`` (64 -> hidden -> hidden -> 10) in the workload
    form: no dropout, no logging, a fixed learning rate."""

    def __init__(self, hidden: int = 128, lr: float = 3e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.lr = lr
        self.net = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10))
