"""fw: a PyTorch training framework. ``import framework as fw``.

The public names are loaded on first use, so ``import framework`` stays light (no TensorBoard,
rich or scikit-learn until a part that needs them runs).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "TrainModule": "framework.module",
    "DataModule": "framework.data",
    "LightningModule": "framework.module",  # Lightning's names of the two, for `import framework as L`
    "LightningDataModule": "framework.data.datamodule",
    "Trainer": "framework.trainer",
    "Callback": "framework.callbacks.base",
    "seed_everything": "framework.seed",
    "ConfigError": "framework.errors",
    "DistributedSetupError": "framework.errors",
    "CheckpointError": "framework.errors",
    "rank_zero_only": "framework.rank_zero",
    "TrainOptimizer": "framework.module",
    "LightningOptimizer": "framework.module",
    "Tuner": "framework.tuner",
}

#: subpackages reached as attributes (``fw.callbacks.ModelCheckpoint``, ``fw.parallel.parallelize``), imported on
#: first use, as ``pl.callbacks`` after ``import lightning.pytorch as pl``
_SUBMODULES = ("accelerators", "callbacks", "data", "environments", "loggers", "parallel", "profilers", "strategies",
               "trainer", "tuner")

__all__ = [*_EXPORTS, *_SUBMODULES]


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"framework.{name}")  # the import sets it as this module's attribute
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'framework' has no attribute '{name}'")
