"""A class rebuilt from a checkpoint, as Lightning's ``load_from_checkpoint`` does it: built from
the hyperparameters the checkpoint saved (or those of an ``hparams_file``), then given the
weights (a ``TrainModule``) or its state (a ``DataModule``)."""

from __future__ import annotations

import inspect
import os
from typing import Any

import torch

from framework.checkpointing.file import load_checkpoint, state_dict_mismatch
from framework.errors import CheckpointError, ConfigError
from framework.paths import storage_path


def build_from_hparams(cls: type, saved: dict, overrides: dict) -> Any:
    """``cls(**hyperparameters)`` from those a checkpoint saved, ``overrides`` winning; only the
    names ``__init__`` takes, unless it takes ``**kwargs``."""
    kwargs = {**saved, **overrides}
    params = inspect.signature(cls).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        kwargs = {k: v for k, v in kwargs.items() if k in params}
    return cls(**kwargs)


def load_for_building(path: Any, map_location: Any, hparams_file: Any, key: str = "hyper_parameters") -> dict:
    """The checkpoint a class is rebuilt from (on the CPU unless ``map_location`` says), the
    hyperparameters under ``key`` replaced by ``hparams_file``'s (YAML or CSV) when given, as
    Lightning's ``load_from_checkpoint`` reads them."""
    path = storage_path(path, "checkpoint_path")
    checkpoint = load_checkpoint(path, map_location=map_location if map_location is not None else "cpu")
    if hparams_file is not None:
        checkpoint[key] = hparams_from_file(hparams_file)
    return checkpoint


def load_from_checkpoint(cls, path: str | os.PathLike, map_location: Any = None, strict: bool | None = None,
                         hparams_file: Any = None, **overrides: Any):
    """``cls`` built from the hyperparameters saved in the checkpoint at ``path`` (``overrides``
    win; only names ``__init__`` takes, unless it takes ``**kwargs``), its ``on_load_checkpoint``
    run, the weights loaded (``strict`` by default) and the module moved where they were
    loaded to (``map_location``, the CPU when None); ``hparams_file`` (YAML or CSV) replaces the
    saved hyperparameters. As Lightning's ``load_from_checkpoint``."""
    checkpoint = load_for_building(path, map_location, hparams_file)
    module = build_from_hparams(cls, checkpoint.get("hyper_parameters", {}), overrides)
    module.on_load_checkpoint(checkpoint)
    chosen = module.__dict__.get("_strict_loading")  # set in __init__ (module.strict_loading = False)
    if chosen is not None and strict is not None and strict != chosen:
        raise ConfigError(f"{cls.__name__}.load_from_checkpoint(strict={strict}) contradicts "
                          f"{cls.__name__}.strict_loading={chosen}: give the same value to both, or only one")
    strict = getattr(module, "strict_loading", True) if strict is None else strict
    try:
        module.load_state_dict(checkpoint["state_dict"], strict=strict)
    except RuntimeError as err:
        raise CheckpointError(f"checkpoint '{path}' does not fit {cls.__name__}: {state_dict_mismatch(err)}") from None
    device = next((t.device for t in checkpoint["state_dict"].values() if isinstance(t, torch.Tensor)), None)
    return module.to(device) if device is not None else module


def hparams_from_file(path: Any) -> dict[str, Any]:
    """Hyperparameters from a YAML file (``hparams.yaml``, as the loggers write it) or a CSV of
    ``key,value`` rows, for ``load_from_checkpoint(hparams_file=...)`` (Lightning's formats)."""
    import ast
    import csv

    import yaml

    suffix = os.path.splitext(os.fspath(path))[1].lower()
    with open(path, newline="") as f:
        if suffix in (".yaml", ".yml"):
            return dict(yaml.safe_load(f) or {})
        if suffix == ".csv":
            def value(text: str) -> Any:
                try:
                    return ast.literal_eval(text)
                except (ValueError, SyntaxError):
                    return text

            return {row[0]: value(row[1]) for row in list(csv.reader(f))[1:]}
    raise ConfigError(f"hparams_file '{path}': give a .yaml, .yml or .csv file, as Lightning reads")
