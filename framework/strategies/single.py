from __future__ import annotations

from framework.strategies.base import Strategy


class SingleDeviceStrategy(Strategy):
    """One process on one device (``devices[0]``), no process group."""

    name = "single"
