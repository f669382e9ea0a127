"""DDP over Gloo or NCCL: ``DDPStrategy`` (``ddp_gloo``, ``ddp_nccl``; ``strategy.py``) and
``SpawnDDPStrategy`` (``ddp_spawn``, ``ddp_notebook``; ``spawn.py``), whose workers are started
from inside the call. What DDP over any backend shares is ``strategies/distributed.py``; how the
workers are started, ``strategies/launchers/``."""

from framework.strategies.ddp.spawn import SpawnDDPStrategy
from framework.strategies.ddp.strategy import DDPStrategy

__all__ = ["DDPStrategy", "SpawnDDPStrategy"]
