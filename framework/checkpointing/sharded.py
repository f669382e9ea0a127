"""A sharded checkpoint's folder (FSDP's ``state_dict_type="sharded"``): its layout, and its
tensors read whole into one process, with no process group (``load_checkpoint`` of one process,
DDP, ``fw checkpoint export``, ``load_from_checkpoint``).

``epoch=0-step=10.ckpt/`` holds:

- ``.metadata`` and ``__<rank>_0.distcp``: those of ``torch.distributed.checkpoint`` (DCP), with
  the tensors of the model (``model/<name>``) and of each optimizer
  (``optimizer<i>/<name>/<state>``), tensors only;
- ``fw_state.pt``: the rest as fw's one-file checkpoint holds it (read by ``file.read_fw_file``);
- ``COMMITTED``: written last, once every rank's shards and ``fw_state.pt`` are on disk; a folder
  without it is never loaded.

FSDP writes the folder, and reads each rank's part of every tensor
(``framework/strategies/fsdp/sharded_checkpoint.py``).

In object storage (a URL, ``paths.py``) the folder is a prefix: DCP's fsspec writer and reader
write and read it, and ``COMMITTED``, uploaded last, is what makes it complete.

DCP reads ``.metadata`` with ``pickle``; fw reads it with an unpickler that knows DCP's metadata
classes and nothing else (``read_metadata``), so a sharded checkpoint cannot run code, as
``weights_only`` keeps a file from running code. The imports of DCP wait for the first folder read.
"""

from __future__ import annotations

import io
import os
import pickle
import warnings
from pathlib import Path
from typing import Any

import torch

from framework import paths
from framework.errors import CheckpointError

FW_FILE, COMMIT_MARK, PARTIAL = "fw_state.pt", "COMMITTED", ".partial"


def is_sharded(path: str | os.PathLike) -> bool:
    """Is ``path`` a folder that fw's sharded save wrote (or began to)?"""
    if paths.is_url(path):
        url = os.fspath(path)
        return paths.isdir(url) and any(name in (FW_FILE, ".metadata", COMMIT_MARK) for name in paths.listdir(url))
    folder = Path(path)
    return folder.is_dir() and ((folder / FW_FILE).exists() or (folder / ".metadata").exists())


def is_committed(path: str | os.PathLike) -> bool:
    """Does the sharded folder ``path`` hold its commit mark (its save finished)?"""
    return paths.exists(paths.join(os.fspath(path), COMMIT_MARK))


def committed_fw_file(path: str | os.PathLike) -> str:
    """The ``fw_state.pt`` of the complete sharded checkpoint at ``path``.

    Raises:
        CheckpointError: the folder has no commit mark (a save that did not finish writes none).
    """
    if not is_committed(path):
        raise CheckpointError(f"checkpoint '{path}' is incomplete (no {COMMIT_MARK} mark: a save that did not finish "
                              "writes none); it was not loaded. Resume from an earlier checkpoint")
    return paths.join(os.fspath(path), FW_FILE)


def with_full_tensors(checkpoint: dict[str, Any], path: str | os.PathLike, map_location: Any = "cpu") -> dict[str, Any]:
    """``checkpoint`` (the folder's ``fw_state.pt``) as fw's one-file checkpoint: the full tensors
    of the folder at ``path`` added (read into this process alone, no collective), the optimizer
    state keyed by parameter name."""
    import torch.distributed.checkpoint as dcp

    metadata = read_metadata(path)
    tensors = {key: torch.empty(meta.size, dtype=meta.properties.dtype)
               for key, meta in metadata.state_dict_metadata.items()}
    with warnings.catch_warnings():  # DCP's note that no process group is used: none is meant to be
        warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process")
        dcp.load(tensors, storage_reader=storage_reader(path, metadata), no_dist=True)
    if map_location not in (None, "cpu"):
        tensors = {key: value.to(map_location) for key, value in tensors.items()}
    checkpoint["state_dict"] = {key[len("model/"):]: value for key, value in tensors.items() if key.startswith("model/")}
    if "optimizer_states" in checkpoint:
        checkpoint["optimizer_states"] = [_optimizer_state(tensors, i, saved)
                                          for i, saved in enumerate(checkpoint["optimizer_states"])]
    return checkpoint


def _optimizer_state(tensors: dict[str, torch.Tensor], index: int, saved: dict) -> dict:
    state: dict[str, dict] = {name: dict(entries) for name, entries in saved["state"].items()}
    prefix = f"optimizer{index}/"
    for key, value in tensors.items():
        if key.startswith(prefix):
            name, _, entry = key[len(prefix):].rpartition("/")
            state.setdefault(name, {})[entry] = value
    return {"state": state, "param_groups": saved["param_groups"]}


# -- DCP's metadata, read safely ------------------------------------------------------------------
_ALLOWED = {
    ("pathlib", "PosixPath"), ("pathlib", "WindowsPath"), ("torch", "Size"), ("torch.serialization", "_get_layout"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED or module == "torch.distributed.checkpoint.metadata":
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"{module}.{name}")


def read_metadata(path: str | os.PathLike) -> Any:
    """The folder's ``.metadata`` (DCP's), unpickled safely; refused unless it lists tensors alone."""
    from torch.distributed.checkpoint.metadata import StorageMeta, TensorStorageMetadata

    try:
        metadata = _MetadataUnpickler(io.BytesIO(paths.read_bytes(paths.join(os.fspath(path), ".metadata")))).load()
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ValueError) as err:
        raise CheckpointError(f"checkpoint '{path}': its .metadata is missing or holds data that is not DCP's "
                              f"({type(err).__name__}: {str(err)[:100]}); it was left as it is") from None
    others = [key for key, meta in metadata.state_dict_metadata.items() if not isinstance(meta, TensorStorageMetadata)]
    if others:
        raise CheckpointError(f"checkpoint '{path}' holds non-tensor entries ({', '.join(others[:3])}), which fw never "
                              "writes and does not unpickle; load it with torch.distributed.checkpoint if you trust it")
    if getattr(metadata, "storage_meta", None) is None:
        metadata.storage_meta = StorageMeta()
    return metadata


def storage_reader(path: str | os.PathLike, metadata: Any) -> Any:
    """DCP's file reader (its fsspec reader for a URL), given the metadata read above (it never
    unpickles the file itself)."""
    from torch.distributed.checkpoint import FileSystemReader

    if paths.is_url(path):
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

        reader: FileSystemReader = FsspecReader(os.fspath(path), **paths.options_for(os.fspath(path)))
    else:
        reader = FileSystemReader(os.fspath(path))
    metadata.storage_meta.load_id = reader.load_id
    reader.read_metadata = lambda *args, **kwargs: metadata  # type: ignore[method-assign]
    return reader
