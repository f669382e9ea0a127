"""Distributed sampler injection: each rank's loaders read that rank's shard.

Every loader gets a sampler that gives this rank its shard:
- training, in every run (one process too): ``GlobalOrderSampler`` (``global_order.py``), one
  order per epoch from the run's seed whatever the number of ranks, rank r taking positions r,
  r+N, ... of it (padded so every rank takes as many steps, which DDP needs), so N ranks with
  batch B see exactly what one process with batch N*B sees, shuffled or not;
- evaluation, when the run is distributed: ``EvalShardSampler``, the same interleaving
  **without padding**, so no sample is counted twice and a metric over N ranks equals the
  single-process one.
A custom sampler is wrapped: its indices are drawn (alike on every rank), then sharded the same
way. The epoch is passed to ``set_epoch`` every epoch, so shuffled orders change per epoch and
are reproducible from the seed.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sized
from typing import Any

from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    Sampler,
    SequentialSampler,
)

from framework.data.global_order import GlobalOrderSampler, draw
from framework.rank_zero import rank_zero_warn


class EvalShardSampler(Sampler[int]):
    """Rank r of N takes positions r, r+N, ... of the order, without padding.

    The order is the data set's own (a shuffled evaluation loader is read in order: order does
    not change a metric, and each rank's own shuffle would count some samples twice), or that of
    a custom sampler drawn identically on every rank.
    """

    def __init__(self, base: Iterable[int] | None, data_len: int, num_replicas: int, rank: int, seed: int = 0) -> None:
        self.base, self.data_len = base, data_len
        self.num_replicas, self.rank, self.seed, self.epoch = num_replicas, rank, seed, 0

    def __iter__(self) -> Iterator[int]:
        order = draw(self.base, self.seed + self.epoch) if self.base is not None else range(self.data_len)
        return iter(order[self.rank :: self.num_replicas])

    def __len__(self) -> int:
        total = len(_sized(self.base)) if self.base is not None else self.data_len
        return len(range(self.rank, total, self.num_replicas))

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if self.base is not None and hasattr(self.base, "set_epoch"):
            self.base.set_epoch(epoch)


def _sized(obj: object) -> Sized:
    """``obj``, which must have a length (raises the TypeError ``len`` would)."""
    if not isinstance(obj, Sized):
        raise TypeError(f"object of type '{type(obj).__name__}' has no len()")
    return obj


def shard_dataloader(loader: DataLoader, num_replicas: int, rank: int, seed: int) -> DataLoader:
    """An evaluation ``loader`` rebuilt with this rank's shard (or unchanged when it must not be)."""
    if not _plain(loader, warn=True) or isinstance(loader.sampler, (DistributedSampler, EvalShardSampler)):
        return loader
    sampler = loader.sampler
    base = None if isinstance(sampler, (SequentialSampler, RandomSampler)) else sampler
    return _rebuild(loader, EvalShardSampler(base, len(_sized(loader.dataset)), num_replicas, rank, seed))


def in_global_order(loader: DataLoader, num_replicas: int, rank: int, seed: int) -> DataLoader:
    """A training ``loader`` rebuilt to read this rank's positions of the run's global order
    (``global_order.py``: the same order on any number of ranks, one process included), or
    unchanged when it must not be (in one process, a DataLoader subclass keeps its own sampler:
    rebuilding it as a DataLoader would lose what the subclass adds)."""
    if not _plain(loader, warn=num_replicas > 1) or isinstance(loader.sampler, (DistributedSampler, GlobalOrderSampler)):
        return loader
    if num_replicas == 1 and type(loader) is not DataLoader:
        return loader  # a DataLoader subclass (a stateful one, say) keeps its own sampler where none is needed
    sampler = loader.sampler
    plain_shuffle = type(sampler) is RandomSampler and not sampler.replacement and sampler._num_samples is None
    generator = getattr(sampler, "generator", None)
    if plain_shuffle and generator is not None:
        seed = generator.initial_seed()  # keep the loader's own seed
    base = None if plain_shuffle or type(sampler) is SequentialSampler else sampler
    size = len(_sized(base if base is not None else loader.dataset))
    assert loader.batch_size is not None, "_plain: a loader with a batch size"
    order = GlobalOrderSampler(size, num_replicas, rank, seed, shuffle=plain_shuffle, base=base,
                               batch_size=loader.batch_size, drop_last=loader.drop_last)
    return _rebuild(loader, order)


def _plain(loader: Any, warn: bool) -> bool:
    """A DataLoader over a map-style data set with torch's own batch sampler (what fw can shard);
    a custom batch sampler is left alone (with a warning, when it would need a shard)."""
    if not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset):
        return False  # iterable data shard themselves
    if loader.batch_size is None or type(loader.batch_sampler) is not BatchSampler:
        if warn:
            rank_zero_warn("a DataLoader with a custom batch_sampler is not sharded; shard it yourself")
        return False
    return True


def skipping_first_batches(loader: Any, batches: int) -> DataLoader | None:
    """A copy of ``loader`` for one epoch that leaves out its first ``batches`` batches by
    drawing their indices only: no sample of them is loaded, so a mid-epoch resume costs the
    same wherever the epoch stopped. The order and the random draws are the original's. None
    for loaders it cannot do this for (iterable data sets, objects that are not DataLoaders, and
    loaders with worker processes, whose own RNG and batch-to-worker order depend on every
    sample they loaded: those are drawn and dropped)."""
    if (not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset)
            or loader.batch_sampler is None or loader.num_workers > 0):
        return None  # worker processes: their RNG and batch assignment follow the samples loaded
    return _rebuild(loader, None, batch_sampler=_SkipFirst(loader.batch_sampler, batches))


class _SkipFirst(Sampler[list]):
    """A batch sampler without the first ``batches`` batches of another. The skip happens at
    the first batch, or earlier when ``started.skip()`` is called: a resume calls it right
    after creating the loader's iterator, so the sampler's random draw comes exactly where it
    came in the run that was stopped, before the RNG state is put back."""

    def __init__(self, batch_sampler: Any, batches: int) -> None:
        self.batch_sampler, self.batches = batch_sampler, batches
        self.started: _Skipping | None = None

    def __iter__(self) -> _Skipping:
        self.started = _Skipping(iter(self.batch_sampler), self.batches)
        return self.started

    def __len__(self) -> int:
        return max(0, len(self.batch_sampler) - self.batches)


class _Skipping:
    def __init__(self, batches: Iterator[list], count: int) -> None:
        self.batches, self.count = batches, count

    def skip(self) -> None:
        for _ in range(self.count):
            next(self.batches, None)
        self.count = 0

    def __iter__(self) -> _Skipping:
        return self

    def __next__(self) -> list:
        self.skip()
        return next(self.batches)


def _rebuild(loader: DataLoader, sampler: Sampler | None, batch_sampler: Any = None) -> DataLoader:
    kwargs: dict[str, Any] = {
        "batch_size": loader.batch_size,
        "sampler": sampler,
        "num_workers": loader.num_workers,
        "collate_fn": loader.collate_fn,
        "pin_memory": loader.pin_memory,
        "drop_last": loader.drop_last,
        "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn,
        "generator": loader.generator,
        "persistent_workers": loader.persistent_workers,
        "pin_memory_device": loader.pin_memory_device,
    }
    if loader.num_workers > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
        kwargs["multiprocessing_context"] = loader.multiprocessing_context
    if batch_sampler is not None:  # it decides the batches: DataLoader takes no size or sampler then
        kwargs.update(batch_size=1, sampler=None, drop_last=False, batch_sampler=batch_sampler)
    return DataLoader(loader.dataset, **kwargs)


def set_sampler_epoch(loader: Any, epoch: int) -> None:
    """Call ``set_epoch`` on the loader's sampler(s) so shuffles differ per epoch."""
    for obj in (getattr(loader, "sampler", None), getattr(getattr(loader, "batch_sampler", None), "sampler", None)):
        if obj is not None and hasattr(obj, "set_epoch"):
            obj.set_epoch(epoch)


def without_shuffle(loader: Any) -> Any:
    """``loader`` with its RandomSampler replaced by a SequentialSampler (``overfit_batches``:
    the same batches every epoch, as Lightning does); other loaders unchanged."""
    if isinstance(loader, DataLoader) and isinstance(loader.sampler, RandomSampler) and loader.batch_size is not None:
        rank_zero_warn("overfit_batches: the training DataLoader's shuffling is turned off, so that every epoch "
                       "sees the same batches")
        return _rebuild(loader, SequentialSampler(_sized(loader.dataset)))
    return loader


def iterate_after(loader: Any, batches: int) -> Iterator:
    """An iterator over ``loader`` without its first ``batches`` batches. A DataLoader skips
    them by their indices alone (``skipping_first_batches``: no sample of them is loaded), with
    the sampler's random draw made now, where it came in the run that was stopped; anything
    else draws and drops them."""
    skipping = skipping_first_batches(loader, batches)
    if skipping is None:
        iterator = iter(loader)
        for _ in range(batches):
            next(iterator)
        return iterator
    iterator = iter(skipping)
    sampler = skipping.batch_sampler
    assert isinstance(sampler, _SkipFirst) and sampler.started is not None  # iter() started it
    sampler.started.skip()  # the sampler draws now, as it did then
    return iterator
