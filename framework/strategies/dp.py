"""``torch.nn.DataParallel``: one process, one thread per visible GPU.

The batch is split along its first dimension across ``devices``; each replica runs
``training_step`` and the per-replica losses are averaged. Without GPUs it runs on one device
(the CPU) and says so, so that a recipe written for a GPU box still runs on a laptop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from framework.environments import ClusterEnvironment
from framework.errors import ConfigError
from framework.rank_zero import rank_zero_warn
from framework.strategies.base import StepModule, Strategy

if TYPE_CHECKING:
    from framework.module import TrainModule


class DataParallelStrategy(Strategy):
    """``torch.nn.DataParallel`` in one process: each batch split over the visible GPUs, the replicas'
    losses averaged; on one device (the CPU) where there is no GPU, with a warning."""

    name = "dp"

    def check(self, devices: Any, num_devices: int, num_nodes: int, environment: ClusterEnvironment) -> None:
        super().check(devices, num_devices, num_nodes, environment)
        if num_devices > 1 and self.accelerator_name != "cuda":
            raise ConfigError(f"trainer.strategy=dp with trainer.devices={devices} needs GPUs (DataParallel splits "
                              f"each batch over GPUs); on the CPU use trainer.strategy=ddp_gloo with "
                              f"trainer.devices={num_devices}, or devices=1")

    def setup_module(self, module: TrainModule) -> nn.Module:
        assert self.accelerator is not None, "connect() first"
        module.to(self.root_device)
        if self.root_device.type != "cuda":
            rank_zero_warn("strategy=dp: no GPU in use, running on one device (cpu) without DataParallel; "
                           "use trainer.strategy=single on the CPU")
            self.model = module
            return module
        device_ids = [self.accelerator.device_for(i).index for i in self.devices]
        self.model = nn.DataParallel(StepModule(module), device_ids=device_ids)
        return self.model

    def training_step_fn(self, module: TrainModule) -> Callable[..., Any]:
        model = self.model
        if not isinstance(model, nn.DataParallel):
            return module.training_step
        return lambda *args: _mean_over_replicas(model(*args))

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "replicas": len(self.devices) if self.root_device.type == "cuda" else 1}


def _mean_over_replicas(output: Any) -> Any:
    """DataParallel gathers a 0-dim loss from each replica into a vector: average it."""
    if isinstance(output, torch.Tensor) and output.dim() == 1:
        return output.mean()
    if isinstance(output, dict) and isinstance(output.get("loss"), torch.Tensor):
        return {**output, "loss": output["loss"].mean()}
    return output
