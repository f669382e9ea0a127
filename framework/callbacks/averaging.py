"""What the weight-averaging callbacks share: the averaged copy of the module, kept in step with it.

``StochasticWeightAveraging`` and ``WeightAveraging`` (EMA) hold a ``torch.optim.swa_utils.
AveragedModel``: a deep copy of the module whose parameters (and, for EMA, buffers) hold the
average. The copy is made in ``setup``, as Lightning makes it, while the module is still on the
CPU and unwrapped; ``conform`` then follows the module once the run has set it up: the copy is
rebuilt when ``configure_model`` added layers after it was made (a copy with fewer tensors would
be zipped against the module's, silently short), and its tensors take the module's dtypes (a
``64-true`` model is not averaged in float32) and the averaging device.

Sharded strategies are refused: each rank holds only a shard of every parameter there, and a
deep copy of a shard is not a model to average. Last, the BatchNorm layers of a module and their
statistics averaged over the ranks (SWA's BatchNorm epoch, where each rank gathers its own).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from framework.errors import ConfigError

if TYPE_CHECKING:
    from torch.optim.swa_utils import AveragedModel

    from framework.module import TrainModule
    from framework.trainer import Trainer

#: strategies whose ranks hold shards of the parameters
SHARDED = ("fsdp", "model_parallel")


def refuse_sharded(trainer: Trainer, who: str) -> None:
    name = getattr(trainer.strategy, "name", "")
    if name in SHARDED:
        raise ConfigError(f"{who} does not support sharded models (trainer.strategy={name}): every rank holds a shard "
                          "of each parameter; train with strategy=ddp (the model whole on every rank) to average it")


@contextlib.contextmanager
def _without_trainer(module: nn.Module) -> Iterator[None]:
    """The module without its Trainer for a moment: a deep copy must not copy the Trainer too."""
    trainer = module.__dict__.get("_trainer")
    object.__setattr__(module, "_trainer", None)
    try:
        yield
    finally:
        object.__setattr__(module, "_trainer", trainer)


def averaged_copy(module: TrainModule, device: torch.device | str | int | None, **kwargs: Any) -> AveragedModel:
    """An ``AveragedModel`` of ``module`` (its own deep copy, on ``device``; None: where the module is)."""
    from torch.optim.swa_utils import AveragedModel

    with _without_trainer(module):
        return AveragedModel(module, device=torch.device(device) if isinstance(device, str) else device, **kwargs)


def _layout(module: nn.Module) -> list[tuple[str, tuple[int, ...]]]:
    return [(name, tuple(t.shape)) for name, t in itertools.chain(module.named_parameters(), module.named_buffers())]


def conform(average: AveragedModel, module: TrainModule, device: torch.device | str | int | None,
            **kwargs: Any) -> AveragedModel:
    """``average`` made to fit ``module`` as the run set it up: rebuilt if their tensors differ, its
    tensors in the module's dtypes, on ``device`` (None: the module's device). Idempotent."""
    if _layout(average.module) != _layout(module):  # configure_model built layers after the copy
        return averaged_copy(module, device, **kwargs)
    target = torch.device(device) if isinstance(device, (str, int)) else device or module_device(module)
    average.to(target)
    pairs = zip(itertools.chain(average.module.parameters(), average.module.buffers()),
                itertools.chain(module.parameters(), module.buffers()), strict=True)
    for mine, theirs in pairs:
        if mine.is_floating_point() and mine.dtype != theirs.dtype:
            mine.data = mine.data.to(theirs.dtype)
    return average


def module_device(module: nn.Module) -> torch.device:
    for tensor in itertools.chain(module.parameters(), module.buffers()):
        return tensor.device
    return torch.device("cpu")


def copy_into(source: nn.Module, target: nn.Module, buffers: bool) -> None:
    """``target``'s parameters (and buffers) set to ``source``'s, in place, on ``target``'s devices."""
    chain = (lambda m: itertools.chain(m.parameters(), m.buffers())) if buffers else (lambda m: m.parameters())
    with torch.no_grad():
        for src, dst in zip(chain(source), chain(target), strict=True):
            dst.copy_(src.to(dst.device))


def swap(first: nn.Module, second: nn.Module) -> None:
    """Exchange the values of the two modules' parameters and buffers, in place."""
    with torch.no_grad():
        for a, b in zip(itertools.chain(first.parameters(), first.buffers()),
                        itertools.chain(second.parameters(), second.buffers()), strict=True):
            kept = a.detach().clone()
            a.copy_(b.to(a.device))
            b.copy_(kept.to(b.device))


def batch_norms(module: nn.Module) -> list[nn.modules.batchnorm._BatchNorm]:
    return [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def average_batch_norms_over_ranks(trainer: Trainer, module: nn.Module) -> None:
    """Each BatchNorm's running mean and variance averaged over the ranks (equal batch counts)."""
    strategy = trainer.strategy
    if not strategy.is_distributed:
        return
    for layer in batch_norms(module):
        for stats in (layer.running_mean, layer.running_var):
            if stats is not None:
                stats.copy_(strategy.all_reduce_over_data(stats.to(strategy.collective_device), "mean"))
