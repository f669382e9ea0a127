"""A run's data: ``DataModule`` (datamodule.py), the training data's one order for any number of
ranks (global_order.py) and the sampler injection that gives every rank its shard
(sampler_injection.py)."""

from framework.data.datamodule import DataModule, batch_size_of
from framework.data.global_order import GlobalOrderSampler
from framework.data.sampler_injection import (
    EvalShardSampler,
    in_global_order,
    set_sampler_epoch,
    shard_dataloader,
    skipping_first_batches,
)

__all__ = ["DataModule", "EvalShardSampler", "GlobalOrderSampler", "batch_size_of", "in_global_order",
           "set_sampler_epoch", "shard_dataloader", "skipping_first_batches"]
