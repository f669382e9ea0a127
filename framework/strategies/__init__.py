"""Strategies, one registry: ``single``, ``dp``, ``ddp_gloo``, ``ddp_nccl``, ``ddp``, ``mpi``.

``trainer.strategy`` is a name or a mapping ``{name: ..., option: value}``; ``ddp`` means NCCL
on CUDA and Gloo otherwise.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping

from framework.errors import ConfigError
from framework.strategies.base import StepModule, Strategy
from framework.strategies.ddp import DDPStrategy
from framework.strategies.distributed import DistributedStrategy
from framework.strategies.dp import DataParallelStrategy
from framework.strategies.mpi import MPIStrategy
from framework.strategies.registry import StrategyRegistry
from framework.strategies.single import SingleDeviceStrategy

STRATEGIES = StrategyRegistry()
STRATEGIES.register("single", SingleDeviceStrategy, "one device, one process")
STRATEGIES.register("dp", DataParallelStrategy, "torch.nn.DataParallel over the visible GPUs")
STRATEGIES.register("ddp_gloo", functools.partial(DDPStrategy, backend="gloo"), "DDP over Gloo")
STRATEGIES.register("ddp_nccl", functools.partial(DDPStrategy, backend="nccl"), "DDP over NCCL")
STRATEGIES.register("mpi", MPIStrategy, "DDP with communication over MPI (mpiexec)")


def create_strategy(spec: str | Mapping[str, Any] | Strategy, accelerator_name: str) -> Strategy:
    """Build the strategy that ``trainer.strategy`` names; ``ddp`` picks its backend here."""
    if isinstance(spec, Strategy):
        return spec
    if isinstance(spec, str):
        name, options = spec, {}
    elif isinstance(spec, Mapping):
        options = dict(spec)
        if "name" not in options:
            raise ConfigError("trainer.strategy: a mapping needs 'name' (e.g. {name: ddp_gloo, timeout: 600})")
        name = options.pop("name")
    else:
        raise ConfigError(f"trainer.strategy: expected a name or a mapping, got {type(spec).__name__}")
    if name == "auto":
        name = "single"
    if name == "ddp":
        name = "ddp_nccl" if accelerator_name == "cuda" else "ddp_gloo"
    if name == "ddp_nccl" and accelerator_name != "cuda":
        raise ConfigError(
            "trainer.strategy=ddp_nccl needs CUDA (NCCL has no CPU support); "
            "use trainer.strategy=ddp_gloo on CPU, or trainer.accelerator=cuda on a GPU machine"
        )
    return STRATEGIES.create(name, **options)


__all__ = [
    "STRATEGIES", "DDPStrategy", "DataParallelStrategy", "DistributedStrategy", "MPIStrategy", "SingleDeviceStrategy",
    "StepModule", "Strategy", "StrategyRegistry", "create_strategy",
]
