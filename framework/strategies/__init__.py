"""Strategies, one registry: ``single``, ``dp``, ``ddp_gloo``, ``ddp_nccl``, ``ddp``, ``fsdp``,
``model_parallel``, ``mpi``, ``ft``, ``ft_fsdp``, ``ddp_spawn``, ``ddp_notebook``; Lightning's other names are aliases (``ALIASES``).

``trainer.strategy`` is a name or a mapping ``{name: ..., option: value}``; ``ddp`` means NCCL
on CUDA and Gloo otherwise.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from framework.errors import ConfigError
from framework.strategies.base import StepModule, Strategy
from framework.strategies.ddp import DDPStrategy, SpawnDDPStrategy
from framework.strategies.distributed import DistributedStrategy
from framework.strategies.dp import DataParallelStrategy
from framework.strategies.fsdp import FSDPStrategy
from framework.strategies.ft import FaultTolerantFSDPStrategy, FaultTolerantStrategy
from framework.strategies.model_parallel import ModelParallelStrategy
from framework.strategies.mpi import MPIStrategy
from framework.strategies.registry import StrategyRegistry
from framework.strategies.single import SingleDeviceStrategy

#: every strategy by name, as ``Trainer(strategy=...)`` names it (``STRATEGIES.describe()``: what each is)
STRATEGIES = StrategyRegistry()
STRATEGIES.register("single", SingleDeviceStrategy, "one device, one process")
STRATEGIES.register("dp", DataParallelStrategy, "torch.nn.DataParallel over the visible GPUs")
STRATEGIES.register("ddp_gloo", functools.partial(DDPStrategy, backend="gloo"), "DDP over Gloo")
STRATEGIES.register("ddp_nccl", functools.partial(DDPStrategy, backend="nccl"), "DDP over NCCL")
STRATEGIES.register("fsdp", FSDPStrategy, "fully sharded data parallel (FSDP2) over Gloo or NCCL")
STRATEGIES.register("model_parallel", ModelParallelStrategy,
                    "data parallel x tensor parallel over a 2-D DeviceMesh (configure_model parallelizes)")
STRATEGIES.register("ft", FaultTolerantStrategy,
                    "one replica group of a job that survives a lost replica (torchft; DDP inside the group)")
STRATEGIES.register("ft_fsdp", FaultTolerantFSDPStrategy,
                    "one replica group of a job that survives a lost replica (torchft; FSDP inside the group)")
STRATEGIES.register("mpi", MPIStrategy, "DDP with communication over MPI (mpiexec)")
STRATEGIES.register("ddp_spawn", functools.partial(SpawnDDPStrategy, start_method="spawn"),
                    "DDP, workers spawned from the call (torch.multiprocessing)")
STRATEGIES.register("ddp_notebook", functools.partial(SpawnDDPStrategy, start_method="fork"),
                    "DDP, workers forked from the call (notebooks, python -)")

#: Lightning's strategy names that are another name, with options, for one of fw's
ALIASES = {
    "single_device": ("single", {}),
    "ddp_fork": ("ddp_notebook", {}),
    "ddp_find_unused_parameters_true": ("ddp", {"find_unused_parameters": True}),
    "ddp_find_unused_parameters_false": ("ddp", {"find_unused_parameters": False}),
    "ddp_spawn_find_unused_parameters_true": ("ddp_spawn", {"find_unused_parameters": True}),
    "ddp_notebook_find_unused_parameters_true": ("ddp_notebook", {"find_unused_parameters": True}),
}
STRATEGIES.other_names = ["auto", "ddp", *ALIASES]


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
    if name in ALIASES:
        name, implied = ALIASES[name]
        options = {**implied, **options}
    if name == "auto":
        name = "single"
    if name == "ddp":
        name = "ddp_nccl" if accelerator_name == "cuda" else "ddp_gloo"
    if name in ("ddp_spawn", "ddp_notebook", "fsdp", "model_parallel") and not {"backend", "process_group_backend"} & options.keys():
        options["backend"] = "nccl" if accelerator_name == "cuda" else "gloo"
    if name == "ddp_nccl" and accelerator_name != "cuda":
        raise ConfigError(
            "trainer.strategy=ddp_nccl needs CUDA (NCCL has no CPU support); "
            "use trainer.strategy=ddp_gloo on CPU, or trainer.accelerator=cuda on a GPU machine"
        )
    strategy = STRATEGIES.create(name, accelerator_name, **options)
    strategy.accelerator_name = accelerator_name  # for checks made before connect()
    return strategy


__all__ = ["STRATEGIES", "DDPStrategy", "DataParallelStrategy", "DistributedStrategy", "FSDPStrategy",
           "FaultTolerantFSDPStrategy", "FaultTolerantStrategy", "MPIStrategy",
           "ModelParallelStrategy", "SingleDeviceStrategy", "StepModule", "Strategy", "StrategyRegistry",
           "create_strategy"]
