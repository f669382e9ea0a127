"""Sharded checkpoints (FSDP's ``state_dict_type="sharded"``, its default): a directory that
every rank writes its own shards into with ``torch.distributed.checkpoint`` (DCP). No rank ever
holds the whole model or optimizer state to save it.

``epoch=0-step=10.ckpt/`` holds:

- ``.metadata`` and ``__<rank>_0.distcp``: DCP's, with the tensors of the model
  (``model/<name>``) and of each optimizer (``optimizer<i>/<name>/<state>``), tensors only;
- ``fw_state.pt``: the rest as fw's file holds it (progress, data position, every rank's RNG states
  and metric aggregates, callbacks, schedulers, the scaler, hyperparameters, the optimizers'
  hyperparameters and non-tensor state), written by rank 0 after gathering the per-rank parts;
- ``COMMITTED``: written last, by rank 0, once every rank's shards and ``fw_state.pt`` are on disk.

In object storage (a URL: ``s3://bucket/run/checkpoints/epoch=0-step=10.ckpt``) there is no
rename: the folder is written in place with DCP's fsspec writer, after rank 0 removed the mark
of a folder of that name (``last.ckpt``) and then the folder; ``COMMITTED`` is uploaded last, and
a folder without it is never loaded nor chosen (``checkpointing/search.py``). Such a save is
synchronous.

Locally it is written as ``.<name>.partial`` and renamed to its name once committed (over an older
checkpoint of that name: ``last.ckpt``), so a directory under a checkpoint's name is complete. A
directory without the mark is never loaded; the next fit removes partial ones
(``checkpoint.remove_stale_temp_files``). Loading under FSDP reads each rank's part of every
tensor, on any number of ranks (DCP reshards); elsewhere (one process, DDP, ``fw checkpoint
export``, ``load_from_checkpoint``) the full tensors are read into the CPU (``full_checkpoint``).

DCP reads ``.metadata`` with ``pickle`` and non-tensor entries with ``torch.load(weights_only=
False)``; fw writes tensors alone and reads the metadata with an unpickler that knows DCP's
metadata classes and nothing else (``_metadata``), so a sharded checkpoint cannot run code,
as ``weights_only`` keeps a file from running code.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from framework import paths
from framework.checkpointing import file as ckpt
from framework.checkpointing.file import read_fw_file
from framework.checkpointing.parts import Value, check_count, items_of
from framework.checkpointing.sharded import COMMIT_MARK, FW_FILE, PARTIAL, read_metadata, storage_reader
from framework.checkpointing.sharded import is_sharded as is_sharded  # what FSDPStrategy.load_checkpoint asks
from framework.checkpointing.single_file import save_from_rank_zero
from framework.errors import CheckpointError

if TYPE_CHECKING:
    from concurrent.futures import Future

    from framework.checkpointing.parts import CheckpointParts
    from framework.module import TrainModule
    from framework.strategies.fsdp import FSDPStrategy


# -- writing --------------------------------------------------------------------------------------
def save_sharded(strategy: FSDPStrategy, module: TrainModule, path: str, parts: CheckpointParts,
                 asynchronous: bool = False) -> None:
    """Every rank writes its shards, rank 0 the rest and then the commit mark (call on every
    rank); ``asynchronous``: the shards are written while training goes on (``async_save.py``)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    from framework.strategies.fsdp.async_save import PendingSave, checkpoint_group, finish_pending

    finish_pending(strategy)
    if paths.is_url(path):
        _save_to_url(strategy, module, path, parts)
        return
    final = Path(path)
    partial = final.parent / f".{final.name}{PARTIAL}"
    if strategy.is_global_zero:
        shutil.rmtree(partial, ignore_errors=True)  # a save of this name that was killed
        partial.mkdir(parents=True)
    strategy.barrier("sharded checkpoint folder")
    optimizers = items_of(parts.shared.get("optimizer_states"))
    states = [get_optimizer_state_dict(module, opt) for opt in optimizers]
    tensors, rest = _split(get_model_state_dict(module), states)
    if asynchronous:
        future = cast("Future", dcp.async_save(tensors, checkpoint_id=str(partial),
                                               process_group=checkpoint_group(strategy)))
    else:
        dcp.save(tensors, checkpoint_id=str(partial))
    shared = {**parts.shared, "state_dict": Value.saved_only(dict)}
    if optimizers:
        shared["optimizer_states"] = Value.saved_only(lambda: rest)
    values = {**parts.values, "fw_sharded": "dcp", "fw_optimizer_keys": "names"}
    save_from_rank_zero(strategy, str(partial / FW_FILE), replace(parts, shared=shared, values=values))
    if asynchronous:
        strategy.pending_save = PendingSave(future, partial, strategy.global_rank, strategy.world_size,
                                            strategy.timeout, lambda: _commit(partial, final))
        return
    if strategy.is_global_zero:
        _commit(partial, final)
    strategy.barrier("sharded checkpoint committed")


def _save_to_url(strategy: FSDPStrategy, module: TrainModule, url: str, parts: CheckpointParts) -> None:
    """``save_sharded`` into object storage: the folder written in place, its mark uploaded last."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    if strategy.is_global_zero:  # an older folder of this name stops being complete before anything of it goes
        paths.remove(paths.join(url, COMMIT_MARK))
        paths.remove(url)
    ckpt.wait_for_uploads_on_every_rank(strategy)  # those removals, and any upload before them, are done (or every rank raises)
    strategy.barrier("sharded checkpoint folder")
    optimizers = items_of(parts.shared.get("optimizer_states"))
    states = [get_optimizer_state_dict(module, opt) for opt in optimizers]
    tensors, rest = _split(get_model_state_dict(module), states)
    dcp.save(tensors, storage_writer=FsspecWriter(url, **paths.options_for(url)))
    shared = {**parts.shared, "state_dict": Value.saved_only(dict)}
    if optimizers:
        shared["optimizer_states"] = Value.saved_only(lambda: rest)
    values = {**parts.values, "fw_sharded": "dcp", "fw_optimizer_keys": "names"}
    save_from_rank_zero(strategy, paths.join(url, FW_FILE), replace(parts, shared=shared, values=values))
    ckpt.wait_for_uploads_on_every_rank(strategy)  # fw_state.pt, where it went in the background (or every rank raises)
    if strategy.is_global_zero:  # every rank's shards, DCP's .metadata and fw_state.pt are there
        paths.write_bytes(paths.join(url, COMMIT_MARK), b"every rank's shards and fw_state.pt are written\n")
    strategy.barrier("sharded checkpoint committed")


def _split(model: dict, optimizers: list[dict]) -> tuple[dict[str, torch.Tensor], list[dict]]:
    """The tensors under flat names for DCP, and each optimizer's hyperparameters and non-tensor
    state for ``fw_state.pt``."""
    tensors = {f"model/{name}": value for name, value in model.items() if isinstance(value, torch.Tensor)}
    rest = []
    for i, state in enumerate(optimizers):
        others: dict[str, dict] = {}
        for name, entries in state["state"].items():
            for key, value in entries.items():
                if isinstance(value, torch.Tensor):
                    tensors[f"optimizer{i}/{name}/{key}"] = value
                else:
                    others.setdefault(name, {})[key] = value
        rest.append({"param_groups": state["param_groups"], "state": others})
    return tensors, rest


def _commit(partial: Path, final: Path) -> None:
    """The mark, then the folder under its name (an older one of that name goes after)."""
    mark = partial / COMMIT_MARK
    with open(mark, "w") as f:
        f.write("every rank's shards and fw_state.pt are written\n")
        f.flush()
        os.fsync(f.fileno())
    old = final.parent / f".{final.name}.old"
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(partial, final)
    shutil.rmtree(old, ignore_errors=True)
    ckpt.fsync_dir(final.parent)


# -- reading --------------------------------------------------------------------------------------
def load_sharded(strategy: FSDPStrategy, module: TrainModule, path: str, parts: CheckpointParts) -> dict[str, Any]:
    """Every rank reads its part of every tensor into the sharded module and optimizers, and the
    rest from ``fw_state.pt``; the contents of ``fw_state.pt``."""
    checkpoint = read_fw_file(path)
    shared = dict(parts.shared)
    optimizers = items_of(shared.get("optimizer_states"))
    shared["state_dict"] = Value.loaded_only(lambda _: _load_tensors(module, optimizers, checkpoint, path))
    if optimizers:
        shared["optimizer_states"] = Value.loaded_only(lambda _: None)  # loaded with the model's tensors
    replace(parts, shared=shared).load(checkpoint, strategy.global_rank, strategy.world_size,
                                           (strategy.data_parallel_rank, strategy.data_parallel_size))
    return checkpoint


def _load_tensors(module: TrainModule, optimizers: list, checkpoint: dict, path: str) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    saved = (checkpoint.get("optimizer_states") or []) if optimizers else []  # validate, test, predict: none
    if optimizers:
        check_count(saved, optimizers, "optimizer", path)
    model = get_model_state_dict(module)
    states: list[dict[str, Any]] = [dict(get_optimizer_state_dict(module, opt)) for opt in optimizers]
    tensors, _ = _split(model, states)
    metadata = read_metadata(path)
    saved_tensors = metadata.state_dict_metadata
    if not optimizers:  # validate, test, predict: the weights alone, whatever optimizer state the folder holds
        saved_tensors = {key: value for key, value in saved_tensors.items() if key.startswith("model/")}
    _refuse_other_tensors(path, tensors, saved_tensors)
    dcp.load(tensors, storage_reader=storage_reader(path, metadata))
    set_model_state_dict(module, model)
    for opt, state, mine in zip(optimizers, saved, states, strict=True):
        for name, entries in state["state"].items():
            mine["state"].setdefault(name, {}).update(entries)
        mine["param_groups"] = state["param_groups"]
        set_optimizer_state_dict(module, opt, mine)


def _refuse_other_tensors(path: str, tensors: dict[str, torch.Tensor], saved: dict[str, Any]) -> None:
    """A checkpoint of another model (or optimizer) is named, not half loaded."""
    missing = sorted(set(tensors) - set(saved))
    extra = sorted(set(saved) - set(tensors))
    shapes = sorted(key for key in set(tensors) & set(saved) if tuple(tensors[key].shape) != tuple(saved[key].size))
    if missing or extra or shapes:
        what = [f"{label}: {', '.join(keys[:4])}{' ...' if len(keys) > 4 else ''}"
                for label, keys in (("missing", missing), ("not in this model", extra), ("other shapes", shapes)) if keys]
        raise CheckpointError(f"checkpoint '{path}' does not fit this model and its optimizers ({'; '.join(what)}); "
                              "resume with the model and configure_optimizers() it was written with")
