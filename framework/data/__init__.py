"""A run's data: ``DataModule`` (datamodule.py) and the distributed sampler injection that gives
every rank its shard (sampler_injection.py)."""

from framework.data.datamodule import DataModule, batch_size_of
from framework.data.sampler_injection import (
    EvalShardSampler,
    ShardedSampler,
    set_sampler_epoch,
    shard_dataloader,
    skipping_first_batches,
)

__all__ = ["DataModule", "EvalShardSampler", "ShardedSampler", "batch_size_of", "set_sampler_epoch", "shard_dataloader",
           "skipping_first_batches"]
