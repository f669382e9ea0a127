"""``LoaderSource``: where a run's loaders come from, and how each is made ready for this rank.

A run's loaders are the ones passed to the call (``fit(model, train_dataloaders=...)``), or
else the DataModule's (or the module's own, as in Lightning) ``*_dataloader()``. Each is
sharded for this rank when the strategy asks for it (``use_distributed_sampler``), and the
training loader keeps the same first batches under ``overfit_batches``. With
``reload_dataloaders_every_n_epochs`` the loop asks again; loaders passed directly stay. (A
resumed epoch's iterator, which skips what was trained: ``sampler_injection.iterate_after``.)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

from framework.data.sampler_injection import in_global_order, shard_dataloader, without_shuffle
from framework.errors import ConfigError
from framework.profilers.timing import timed
from framework.stacks import dumping_stacks

#: the method asked for each stage's loaders
LOADER_METHODS = {
    "train": "train_dataloader",
    "validate": "val_dataloader",
    "test": "test_dataloader",
    "predict": "predict_dataloader",
}


@dataclass(frozen=True)
class LoaderSource:
    """Args:
        given: per stage key, the loader(s) passed to the call, or None.
        source: the DataModule, or the module, asked for the others.
        seed: the seed of the training data's order (the same on every rank).
        shard: the strategy's ``distributed_sampler_kwargs()`` (None: the training loader is
            read in its global order by one process).
        eval_shard: the strategy's ``evaluation_sampler_kwargs()``: ``shard``, except under ``ft``
            where each replica group evaluates on its own (None: evaluation loaders are read whole).
        overfit: ``overfit_batches`` is set: the training loader does not shuffle.
        ordered: ``use_distributed_sampler``: the training loader reads the global order (else
            the loader's own sampler, and no shard).
        profiler: what times each ``*_dataloader()`` call (``framework/profilers``; None: nothing).
        stacks: a distributed run: loader workers dump their stacks when asked, for the hang
            report (``framework/stacks.py``: the heartbeat asks the worker a stuck rank waits for).
    """

    given: dict[str, Any]
    source: Any
    seed: int
    shard: dict[str, Any] | None
    overfit: bool
    ordered: bool = True
    profiler: Any = None
    stacks: bool = False
    eval_shard: dict[str, Any] | None = None

    def loaders(self, key: str) -> list:
        """The stage's loaders, ready for this rank ([] when there are none)."""
        given = self.given.get(key)
        try:
            loader = given if given is not None else self._request(LOADER_METHODS[key])
        except ValueError as err:  # torch's RandomSampler on an empty data set
            if "num_samples=0" not in str(err):
                raise
            raise ConfigError(f"{type(self.source).__name__}.{LOADER_METHODS[key]}(): the data set is empty "
                              "(a shuffling DataLoader needs at least one sample); check the data") from None
        if loader is None:
            return []
        if isinstance(loader, Mapping):  # Lightning's named loaders: in their order, as dataloader_idx 0, 1, ...
            loader = list(loader.values())
        loaders = list(loader) if isinstance(loader, (list, tuple)) else [loader]
        if key == "train" and len(loaders) > 1:
            where = "fit(train_dataloaders=...)" if given is not None else \
                f"{type(self.source).__name__}.train_dataloader()"
            raise ConfigError(
                f"{where} gave {len(loaders)} training loaders; fw trains on one (Lightning would zip them into one "
                "batch of batches, CombinedLoader's max_size_cycle): combine them into one DataLoader, e.g. over "
                "torch.utils.data.ConcatDataset, or a Dataset that returns one item of each")
        if key == "train" and self.overfit:
            loaders = [without_shuffle(dl) for dl in loaders]
        if key == "train" and self.ordered:
            loaders = [in_global_order(dl, seed=self.seed, **(self.shard or {"num_replicas": 1, "rank": 0}))
                       for dl in loaders]
        elif key != "train" and self.eval_shard:
            loaders = [shard_dataloader(dl, seed=self.seed, **self.eval_shard) for dl in loaders]
        return [dumping_stacks(dl) for dl in loaders] if self.stacks else loaders

    def _request(self, method: str) -> Any:
        from framework.data.datamodule import DataModule

        kind = "LightningDataModule" if isinstance(self.source, DataModule) else "LightningModule"
        return timed(self.profiler, f"[{kind}]{type(self.source).__name__}.{method}", getattr(self.source, method))()

    def reload(self, loaders: dict[str, list]) -> None:
        """``reload_dataloaders_every_n_epochs``: the training and validation loaders asked for
        again, in place; those passed to the call directly stay."""
        for key in ("train", "validate"):
            if self.given.get(key) is None and loaders.get(key):
                loaders[key] = self.loaders(key)



def shut_down_workers(loaders: list) -> None:
    """End the worker processes that each loader's iterator keeps (a ``persistent_workers=True``
    DataLoader keeps one, and its workers, from one pass to the next), as Lightning does at the
    end of every call; a later pass starts new ones."""
    for loader in loaders:
        iterator = getattr(loader, "_iterator", None)
        if isinstance(iterator, _MultiProcessingDataLoaderIter):
            iterator._shutdown_workers()
            loader._iterator = None
