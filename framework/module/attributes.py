"""A ``TrainModule``'s attributes with Lightning's meaning that no hook or step uses: where it runs
(``device``, ``on_gpu``), whether a checkpoint's weights must match it (``strict_loading``), and
the class attributes Lightning code sets or reads (``prepare_data_per_node``, the checkpoint's
hyperparameter keys)."""

from __future__ import annotations

import torch
from torch import nn


class ModuleAttributes(nn.Module):
    """Mixed into ``TrainModule``."""

    #: the checkpoint keys ``save_hyperparameters``' values are stored under, as in Lightning
    CHECKPOINT_HYPER_PARAMS_KEY = "hyper_parameters"
    #: Lightning's key for the name of the hyperparameters' argument; fw writes no such key
    CHECKPOINT_HYPER_PARAMS_NAME = "hparams_name"
    #: Lightning's key for the type of the hyperparameters; fw writes no such key
    CHECKPOINT_HYPER_PARAMS_TYPE = "hparams_type"
    #: Lightning's switch (False: ``prepare_data`` once per job); fw does not read it: once per machine either way
    prepare_data_per_node = True
    #: Lightning's switch for loaders that are empty on some ranks; fw refuses an empty loader either way
    allow_zero_length_dataloader_with_multiple_devices = False
    #: Lightning Fabric's handle; a TrainModule runs under a Trainer only
    fabric = None

    @property
    def device(self) -> torch.device:
        """Where the module's (first) parameter is; the CPU without parameters."""
        for p in self.parameters():
            return p.device
        return torch.device("cpu")

    @property
    def on_gpu(self) -> bool:
        """Whether the module is on a CUDA device."""
        return self.device.type == "cuda"

    @property
    def strict_loading(self) -> bool:
        """Whether a checkpoint's weights must match the module's exactly (``ckpt_path=`` and
        ``load_from_checkpoint``); set it to False to load a checkpoint that lacks some weights
        (a frozen backbone not saved, say)."""
        return self.__dict__.get("_strict_loading") in (None, True)

    @strict_loading.setter
    def strict_loading(self, value: bool) -> None:
        object.__setattr__(self, "_strict_loading", bool(value))
