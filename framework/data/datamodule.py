"""``DataModule``: a run's data in one object, and the batch size that weights logged means."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader, Dataset

from framework.module.hparams import HyperparametersMixin, class_only

if TYPE_CHECKING:
    from framework.trainer import Trainer


class DataModule(HyperparametersMixin):
    """Owns the data of a run: download once, split, build loaders.

    ``prepare_data`` runs once per machine, on its local rank 0 (download, write files); ``setup(stage)`` runs on
    every rank (``stage`` is ``fit``, ``validate``, ``test`` or ``predict``). As Lightning's
    ``LightningDataModule``: ``save_hyperparameters()`` in ``__init__`` records its arguments in
    ``self.hparams`` (checkpoints keep them: ``load_from_checkpoint``), and ``self.trainer`` is the
    Trainer that runs it. ``__init__`` need not call ``super().__init__()``.
    """

    #: the checkpoint key of ``save_hyperparameters``' values, as in Lightning
    CHECKPOINT_HYPER_PARAMS_KEY = "datamodule_hyper_parameters"
    #: Lightning's key for the name of the hyperparameters' argument; fw writes no such key
    CHECKPOINT_HYPER_PARAMS_NAME = "datamodule_hparams_name"
    #: Lightning's key for the type of the hyperparameters; fw writes no such key
    CHECKPOINT_HYPER_PARAMS_TYPE = "datamodule_hparams_type"
    #: Lightning's switch (False: ``prepare_data`` once per job); fw does not read it: once per machine either way
    prepare_data_per_node = True
    #: Lightning's switch for loaders that are empty on some ranks; fw refuses an empty loader either way
    allow_zero_length_dataloader_with_multiple_devices = False
    #: Lightning's optional name of the data (shown nowhere by fw; kept for code that sets it)
    name: str | None = None
    #: the Trainer that runs this data (set by each call), else None
    trainer: Trainer | None = None

    def __init__(self) -> None:
        self.trainer = None

    @classmethod
    def from_datasets(cls, train_dataset: Any = None, val_dataset: Any = None, test_dataset: Any = None,
                      predict_dataset: Any = None, batch_size: int = 1, num_workers: int = 0,
                      **loader_kwargs: Any) -> DataModule:
        """A DataModule over datasets (each a Dataset or a list/dict of them), as Lightning's:
        the training loader shuffles, the others keep the order."""
        def loaders(given: Any, shuffle: bool) -> Any:
            if isinstance(given, Dataset):
                return DataLoader(given, batch_size=batch_size, shuffle=shuffle, num_workers=num_workers,
                                  **loader_kwargs)
            if isinstance(given, dict):
                return {key: loaders(value, shuffle) for key, value in given.items()}
            return [loaders(value, shuffle) for value in given]

        datamodule = cls()
        for hook, dataset, shuffle in (("train_dataloader", train_dataset, True), ("val_dataloader", val_dataset, False),
                                       ("test_dataloader", test_dataset, False),
                                       ("predict_dataloader", predict_dataset, False)):
            if dataset is not None:
                setattr(datamodule, hook, lambda dataset=dataset, shuffle=shuffle: loaders(dataset, shuffle))
        return datamodule

    @class_only
    def load_from_checkpoint(cls, checkpoint_path: Any, map_location: Any = None,  # type: ignore[override]
                             hparams_file: Any = None, **kwargs: Any) -> Any:
        """This DataModule rebuilt from the hyperparameters a checkpoint keeps
        (``datamodule_hyper_parameters``; ``kwargs`` win), with its ``state_dict`` loaded."""
        from framework.checkpointing.rebuild import build_from_hparams, load_for_building

        checkpoint = load_for_building(checkpoint_path, map_location, hparams_file, cls.CHECKPOINT_HYPER_PARAMS_KEY)
        datamodule = build_from_hparams(cls, checkpoint.get(cls.CHECKPOINT_HYPER_PARAMS_KEY, {}), kwargs)
        state = checkpoint.get(cls.__qualname__)
        if state:
            datamodule.load_state_dict(state)
        return datamodule

    def prepare_data(self) -> None:
        """Download or write files: once per machine (local rank 0), before ``setup``; keep nothing in ``self``."""

    def setup(self, stage: str) -> None:
        """Build the datasets on every rank (``stage``: fit, validate, test or predict), before the loaders."""

    def teardown(self, stage: str) -> None:
        """After ``fit``/``validate``/``test``/``predict`` (not after a failure: ``on_exception``)."""

    def on_exception(self, exception: BaseException) -> None:
        """A run failed with ``exception`` (before it goes on to the caller)."""

    def train_dataloader(self) -> DataLoader:
        """The training loader, which fit requires (fw shards it over the ranks)."""
        raise NotImplementedError(f"{type(self).__name__} has no train_dataloader()")

    def val_dataloader(self) -> DataLoader | None:
        """The validation loader (or a list of them); None: no validation."""
        return None

    def test_dataloader(self) -> DataLoader | None:
        """The test loader (or a list of them), for ``trainer.test``."""
        return None

    def predict_dataloader(self) -> DataLoader | None:
        """The prediction loader (or a list of them), for ``trainer.predict``."""
        return None

    # -- batch transfer: an override here wins over the module's, as in Lightning -------------
    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Change a batch before it moves to the device (on the CPU)."""
        return batch

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        """Move a batch to ``device``: tensors in lists, tuples, dicts and dataclasses, and anything with ``.to``."""
        from framework.accelerators.base import move_to_device

        return move_to_device(batch, device)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Change a batch after it moved to the device (e.g. augment it on the GPU)."""
        return batch

    # -- checkpoints: what ``state_dict`` returns is saved and handed back on resume ----------
    def state_dict(self) -> dict:
        """What to save in every checkpoint; ``load_state_dict`` gets it back on resume."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """On resume: what ``state_dict`` saved in the checkpoint."""


def batch_size_of(batch: Any) -> int:
    """Size of the first dimension of the first tensor in ``batch`` (1 if none)."""
    if isinstance(batch, torch.Tensor):
        return batch.shape[0] if batch.dim() else 1
    if isinstance(batch, (list, tuple)):
        for item in batch:
            return batch_size_of(item)
    if isinstance(batch, dict):
        for item in batch.values():
            return batch_size_of(item)
    return 1


#: Lightning's name, for code written against ``import lightning as L`` (``L.LightningDataModule``)
LightningDataModule = DataModule
