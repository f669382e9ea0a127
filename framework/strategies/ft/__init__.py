"""Replica groups that survive a lost replica, over torchft (``trainer.strategy=ft``, the ``fw[ft]`` extra).

``strategy.py``: ``FaultTolerantStrategy``, DDP inside one replica group and torchft's Manager
across the groups (the replica-group logic is its ``ReplicaGroup`` mixin); ``fsdp.py``:
``FaultTolerantFSDPStrategy`` (``ft_fsdp``), FSDP inside the group; ``replicas.py``: each step's quorum, the gradient average over the replicas
present and the commit, and a restarted replica healed from a live peer; ``untrained.py``: which
global batches were trained without some replica's share; ``lighthouse.py``: the Lighthouse the
replicas meet at (``fw lighthouse``). torchft is imported only when a run uses the strategy.
"""

from framework.strategies.ft.fsdp import FaultTolerantFSDPStrategy
from framework.strategies.ft.strategy import FaultTolerantStrategy

__all__ = ["FaultTolerantFSDPStrategy", "FaultTolerantStrategy"]
