"""The type aliases Lightning code imports (``from lightning.pytorch.utilities.types import
STEP_OUTPUT``), with Lightning's meanings, so that annotated Lightning code runs with its imports
changed to ``from framework.types import ...``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from torch import Tensor
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

from framework.optim import LRSchedulerConfig

#: what ``training_step``/``validation_step`` return: a loss, a dict with ``loss``, or None
STEP_OUTPUT = Tensor | Mapping[str, Any] | None
#: any iterable of batches or collection of such iterables
TRAIN_DATALOADERS = Any
EVAL_DATALOADERS = Any
#: a learning-rate scheduler of either kind
LRSchedulerTypeUnion = LRScheduler | ReduceLROnPlateau
LRSchedulerPLType = LRSchedulerTypeUnion
LRSchedulerTypeTuple = (LRScheduler, ReduceLROnPlateau)


class LRSchedulerConfigType(TypedDict, total=False):
    scheduler: LRSchedulerTypeUnion
    name: str | None
    interval: str
    frequency: int
    reduce_on_plateau: bool
    monitor: str | None
    strict: bool


class OptimizerConfig(TypedDict):
    optimizer: Optimizer


class OptimizerLRSchedulerConfig(TypedDict, total=False):
    optimizer: Optimizer
    lr_scheduler: LRSchedulerTypeUnion | LRSchedulerConfigType
    monitor: str


#: what ``configure_optimizers`` may return
OptimizerLRScheduler = (
    Optimizer
    | Sequence[Optimizer]
    | tuple[Sequence[Optimizer], Sequence[LRSchedulerTypeUnion | LRSchedulerConfig]]
    | OptimizerConfig
    | OptimizerLRSchedulerConfig
    | Sequence[OptimizerConfig]
    | Sequence[OptimizerLRSchedulerConfig]
    | None
)

__all__ = ["EVAL_DATALOADERS", "STEP_OUTPUT", "TRAIN_DATALOADERS", "LRSchedulerConfig", "LRSchedulerConfigType",
           "LRSchedulerPLType", "LRSchedulerTypeTuple", "LRSchedulerTypeUnion", "OptimizerConfig",
           "OptimizerLRScheduler", "OptimizerLRSchedulerConfig"]
