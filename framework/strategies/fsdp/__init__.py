"""``fsdp``: fully sharded data parallel (FSDP2), ``FSDPStrategy`` (``strategy.py``), and its parts:

- ``options.py``: Lightning's arguments (``auto_wrap_policy``, ``device_mesh``, precision) as FSDP2's;
- ``materialize.py``: a model built on the meta device made real shard by shard;
- ``resharding.py``: when a sharded model holds gathered parameters, and how it gives them back;
- ``sharded_checkpoint.py`` (``state_dict_type="sharded"``, a DCP folder each rank writes its
  shards into; ``async_save.py``: written while training goes on) and ``full_checkpoint.py``
  (``"full"``: the one file of DDP, gathered through rank 0).
"""

from framework.strategies.fsdp.strategy import SHARDING, FSDPStrategy

__all__ = ["SHARDING", "FSDPStrategy"]
