"""One process on one device, no process group."""

from __future__ import annotations

from typing import Any

from framework.environments import ClusterEnvironment
from framework.errors import ConfigError
from framework.strategies.base import Strategy


class SingleDeviceStrategy(Strategy):
    """One process on one device (``devices[0]``), no process group."""

    name = "single"

    def check(self, devices: Any, num_devices: int, num_nodes: int, environment: ClusterEnvironment) -> None:
        super().check(devices, num_devices, num_nodes, environment)
        if num_devices > 1:
            raise ConfigError(
                f"trainer.strategy=single uses one device but trainer.devices={devices}; "
                "set trainer.devices=1, or pick ddp (one process per device) or dp"
            )
