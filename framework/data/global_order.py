"""``GlobalOrderSampler``: one order of the training data, whatever the number of ranks.

An epoch's order is a function of the run's seed and the epoch alone: a shuffled loader's is
``torch.randperm`` from a generator seeded ``seed + epoch`` (``DistributedSampler``'s
permutation, bit for bit), an unshuffled one's is the data set's, and a custom sampler's is its
indices drawn from torch's RNG seeded alike. Rank r of N takes positions r, r+N, r+2N, ... of
it, so with B samples per rank the ranks' i-th batches together are positions [i*N*B,
(i+1)*N*B) of the order: the samples one process takes in its i-th batch of N*B. One process
reads the same order (N = 1), which is why a checkpoint of 2 ranks continues on 1 or 3 in the
same data (``trainer/resume.py``: the position is kept in samples of this order).

The end of an epoch: when N does not divide the samples left, the order is padded with its
first samples (as ``DistributedSampler`` pads) so that every rank takes as many steps; that last
global batch then holds up to N-1 samples twice and differs from the one-process batch. With the
loader's ``drop_last`` the epoch ends after its last whole global batch (N*B samples), on any
number of ranks alike.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import Sampler


def draw(sampler: Iterable[int], seed: int) -> list[int]:
    """The sampler's indices, drawn from torch's RNG seeded alike on every rank (a random
    sampler would otherwise give each rank its own order), leaving the global RNG untouched."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return list(sampler)


class GlobalOrderSampler(Sampler[int]):
    """Rank ``rank`` of ``num_replicas``'s positions of the epoch's global order.

    Args:
        data_len: samples in the order (the data set's, or the custom sampler's length).
        shuffle: a seeded permutation per epoch (else the data set's order).
        base: a custom sampler whose indices are the order (drawn with the seed per epoch).
        batch_size, drop_last: the loader's (``drop_last`` ends the epoch at a whole global batch).
    """

    def __init__(self, data_len: int, num_replicas: int = 1, rank: int = 0, seed: int = 0, shuffle: bool = False,
                 base: Iterable[int] | None = None, batch_size: int = 1, drop_last: bool = False) -> None:
        self.data_len, self.num_replicas, self.rank = data_len, num_replicas, rank
        self.seed, self.shuffle, self.base = seed, shuffle, base
        self.batch_size, self.drop_last = batch_size, drop_last
        self.epoch, self.start = 0, 0

    def describe(self) -> dict[str, Any]:
        """What the order depends on (a checkpoint keeps it: another run reads the same order
        only if this is the same)."""
        kind = "custom" if self.base is not None else "shuffled" if self.shuffle else "in order"
        return {"kind": kind, "seed": self.seed, "samples": self.data_len, "drop_last": self.drop_last}

    def epoch_order(self) -> list[int]:
        if self.base is not None:
            return draw(self.base, self.seed + self.epoch)
        if self.shuffle:
            generator = torch.Generator()
            generator.manual_seed(self.seed + self.epoch)
            return torch.randperm(self.data_len, generator=generator).tolist()
        return list(range(self.data_len))

    def start_at(self, samples: int) -> None:
        """The next pass over this epoch leaves out the first ``samples`` of its order (a resume).
        Another epoch's pass reads its whole order (``set_epoch``), also where this epoch had nothing
        left, so that its pass was never read (a checkpoint of the epoch's last batch)."""
        self.start = samples

    def __iter__(self) -> Iterator[int]:
        order, start = self.epoch_order(), self.start
        self.start = 0
        kept = order[start:start + self._kept(len(order) - start)]
        if len(kept) % self.num_replicas:  # DistributedSampler's padding: the order's first samples again
            pad = self.num_replicas - len(kept) % self.num_replicas
            kept += (order * math.ceil(pad / max(len(order), 1)))[:pad]
        return iter(kept[self.rank::self.num_replicas])

    def __len__(self) -> int:
        return math.ceil(self._kept(self.data_len - self.start) / self.num_replicas)

    def _kept(self, left: int) -> int:
        """How many of the ``left`` samples this pass reads (all, or whole global batches)."""
        if not self.drop_last:
            return max(left, 0)
        whole = self.num_replicas * self.batch_size
        return max(left, 0) // whole * whole

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.start = 0  # a resume's start is its epoch's alone
        self.epoch = epoch
        if self.base is not None and hasattr(self.base, "set_epoch"):
            self.base.set_epoch(epoch)
