"""The model, optimiser and timing callback that every benchmark's fw side shares with its raw
side: the same network and step, so the comparison measures the framework and nothing else."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

import framework as fw


def make_mlp(sizes: tuple[int, ...]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def make_optimizer(params, name: str = "adam") -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.01, momentum=0.9)
    return torch.optim.Adam(params, lr=1e-3)


def raw_epochs(model: nn.Module, loader, opt: torch.optim.Optimizer, epochs: int,
               sync: Callable[[], None] = lambda: None,
               before_epoch: Callable[[int], None] = lambda epoch: None) -> list[float]:
    """The hand-written loop every fw side is compared with: ``epochs`` epochs of
    forward/backward/step/zero_grad; returns each epoch's wall time (``sync`` before each
    reading, ``before_epoch`` e.g. a sampler's set_epoch)."""
    model.train()
    times = []
    for epoch in range(epochs):
        before_epoch(epoch)
        sync()
        start = time.perf_counter()
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        sync()
        times.append(time.perf_counter() - start)
    return times


class MLPModule(fw.TrainModule):
    """The same network and step as the raw loops; logs nothing (the raw loops log nothing)."""

    def __init__(self, net: nn.Module, optimizer: str = "adam") -> None:
        super().__init__()
        self.net = net
        self.optimizer_name = optimizer

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return make_optimizer(self.parameters(), self.optimizer_name)


class ManualMLPModule(MLPModule):
    """The same step in manual optimization: the module calls backward and steps itself."""

    def __init__(self, net: nn.Module, optimizer: str = "adam") -> None:
        super().__init__(net, optimizer)
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.manual_backward(loss)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss


class EpochTimer(fw.Callback):
    """Wall time of each training epoch, from two once-per-epoch hooks (no per-step cost);
    ``sync`` (e.g. torch.cuda.synchronize) runs before each reading."""

    def __init__(self, sync: Callable[[], None] = lambda: None) -> None:
        self.sync, self.times, self._start = sync, [], 0.0

    def on_train_epoch_start(self, trainer, module) -> None:
        self.sync()
        self._start = time.perf_counter()

    def on_train_epoch_end(self, trainer, module) -> None:
        self.sync()
        self.times.append(time.perf_counter() - self._start)
