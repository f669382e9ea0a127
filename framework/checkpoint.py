"""Checkpoints: what a run needs to continue bit for bit, written atomically on rank 0.

A checkpoint holds the module's weights, optimiser and scheduler states, the GradScaler, loop
counters, callback states, hyperparameters and the RNG states of every rank (Python, NumPy,
torch, CUDA), including the states at the start of the epoch so that a mid-epoch checkpoint
resumes with the same data order. Files are written to a temporary file in the same directory,
fsynced and renamed, so a crash never leaves a half-written checkpoint under the real name.
Loading uses ``torch.load(weights_only=True)``: a checkpoint cannot run code.
"""

from __future__ import annotations

import contextlib
import glob
import inspect
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from framework.errors import CheckpointError, ConfigError
from framework.paths import local_path

if TYPE_CHECKING:
    from framework.strategies import Strategy

FORMAT_VERSION = 1


def atomic_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save`` to a temp file beside ``path``, fsync, then rename over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            with contextlib.suppress(OSError):  # mkstemp's 0600 would hide the file from the user's group
                os.fchmod(f.fileno(), new_file_mode())
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    fsync_dir(path.parent)


def new_file_mode() -> int:
    """The mode ``open()`` gives a new file: 0o666 less the process's umask (Lightning's files'
    mode; ``tempfile.mkstemp`` makes 0o600)."""
    try:
        with open("/proc/self/status") as f:
            umask = next((int(line.split()[1], 8) for line in f if line.startswith("Umask:")), None)
    except OSError:
        umask = None
    if umask is None:  # not Linux: read it by setting it (back at once)
        umask = os.umask(0o022)
        os.umask(umask)
    return 0o666 & ~umask


def fsync_dir(folder: str | os.PathLike) -> None:
    """Make a rename in ``folder`` durable (the folder's entry list reaches the disk)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def ranks_that_wrote(checkpoint: dict) -> int:
    """How many ranks wrote ``checkpoint`` (its ``world_size``; older files: one RNG state each)."""
    return int(checkpoint.get("world_size") or len(checkpoint.get("rng") or ()) or 1)


def data_ranks_that_wrote(checkpoint: dict) -> int:
    """How many of those ranks read data of their own (fewer under tensor parallelism, where
    the ranks of a group read the same batches): what a mid-epoch position is counted over."""
    return int(checkpoint.get("data_ranks") or ranks_that_wrote(checkpoint))


def load_checkpoint(path: str | os.PathLike, map_location: Any = "cpu") -> dict:
    """Read a checkpoint written by fw; a missing, corrupt or truncated file is a CheckpointError
    and the file is left untouched."""
    path = Path(path)
    if path.is_dir() and _sharded(path):
        from framework.strategies.fsdp.sharded_checkpoint import full_checkpoint

        return full_checkpoint(path, map_location)
    if path.is_dir():
        inside = sorted(p.name for p in path.glob("*.ckpt"))
        hint = f"; it holds {', '.join(inside[:5])}" if inside else "; it holds no .ckpt file"
        raise CheckpointError(f"ckpt_path '{path}' is a directory: give a checkpoint file in it{hint}")
    if not path.is_file():
        raise CheckpointError(f"checkpoint '{path}' does not exist; check ckpt_path")
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # torch raises many types for damaged zip/pickle data
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        if "weights only load failed" in reason.lower():  # torch's advice to unpickle freely: not for a damaged file
            reason = "it holds data that is not a checkpoint's"
        raise CheckpointError(
            f"checkpoint '{path}' is corrupt or truncated ({reason[:200]}); it was left as it is. "
            "Resume from another checkpoint or start without ckpt_path"
        ) from None
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise CheckpointError(f"'{path}' is not an fw checkpoint (no 'state_dict'); check ckpt_path")
    return checkpoint


def _sharded(path: Path) -> bool:
    """A folder a sharded (DCP) save wrote: ``strategies/fsdp/sharded_checkpoint.py``."""
    return (path / "fw_state.pt").exists() or (path / ".metadata").exists()


def read_values(path: str | os.PathLike) -> dict:
    """A checkpoint's entries without its sharded tensors (a sharded checkpoint's ``fw_state.pt``):
    what finding a run's checkpoint needs to read."""
    if Path(path).is_dir() and _sharded(Path(path)):
        from framework.strategies.fsdp.sharded_checkpoint import read_fw_file

        return read_fw_file(path)
    return load_checkpoint(path)


def writable_error(path: str | os.PathLike, what: str) -> str | None:
    """Why ``path`` cannot be created (if needed) and written, or None. A probe file in the
    nearest folder that exists answers without creating anything: a read-only file system, a
    file in the way or a missing permission is named with ``what`` and the path. A folder that
    ``os.access`` finds writable needs no probe (access(2) answers for read-only file systems
    too); the probe names the reason when it does not."""
    existing = Path(os.path.abspath(path))
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing.is_dir() and os.access(existing, os.W_OK | os.X_OK):
        return None
    try:
        if not existing.is_dir():
            raise NotADirectoryError(20, f"'{existing}' is a file")
        fd, probe = tempfile.mkstemp(prefix=".fw-write-probe.", dir=existing)
        os.close(fd)
        os.remove(probe)
    except OSError as err:
        return (f"{what} '{path}' is not a writable directory ({type(err).__name__}: "
                f"{err.strerror or err}); pick a folder fw can create and write")
    return None


def check_writable_on_every_rank(path: str | os.PathLike, what: str, strategy: Strategy) -> None:
    """Rank 0 checks ``writable_error``; every rank raises the same ConfigError (a rank that
    raised alone would leave the others waiting in the next collective)."""
    error = writable_error(path, what) if strategy.is_global_zero else None
    if strategy.is_distributed:
        error = strategy.broadcast(error)
    if error:
        raise ConfigError(error)


def remove_stale_temp_files(directory: str | os.PathLike) -> list[str]:
    """Remove what killed writes left in ``directory`` (``atomic_save``'s ``.NAME.*.tmp``
    files, a sharded save's ``.NAME.partial`` and ``.NAME.old`` folders, a logger's ``.fw-upload-*``
    staging folders of a checkpoint upload); call it when no write
    can be under way there. Returns the removed paths."""
    import shutil

    removed = []
    folder = os.fspath(directory)
    for tmp in glob.glob(os.path.join(folder, ".*.ckpt.*.tmp")):
        try:
            os.remove(tmp)
            removed.append(tmp)
        except OSError:
            pass
    # a logger's upload staging folders (framework/loggers/checkpoint_uploads.py) too
    stale = [".*.ckpt.partial", ".*.ckpt.old", ".fw-upload-*"]
    for partial in [path for pattern in stale for path in glob.glob(os.path.join(folder, pattern))]:
        shutil.rmtree(partial, ignore_errors=True)
        removed.append(partial)
    return removed


def plain_hparams(hparams: dict, keep_types: bool = False) -> dict:
    """Hyperparameters reduced to types that loggers accept; with ``keep_types`` (a checkpoint's),
    to those ``weights_only`` loading gives back as they were (tuples, ``torch.dtype`` and
    ``torch.device`` kept, as Lightning's checkpoints keep them). Anything else becomes its text."""
    def plain(value: Any) -> Any:
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if keep_types and isinstance(value, (torch.dtype, torch.device)):
            return value
        if isinstance(value, tuple) and keep_types:
            return tuple(plain(v) for v in value)
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {str(k): plain(v) for k, v in value.items()}
        try:
            from omegaconf import DictConfig, ListConfig, OmegaConf

            if isinstance(value, (DictConfig, ListConfig)):
                return plain(OmegaConf.to_container(value, resolve=True))
        except ImportError:  # pragma: no cover
            pass
        return str(value)

    return {str(k): plain(v) for k, v in hparams.items()}


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
    path = local_path(path, "checkpoint_path")
    checkpoint = load_checkpoint(path, map_location=map_location if map_location is not None else "cpu")
    if hparams_file is not None:
        from framework.hparams import hparams_from_file

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


def state_dict_mismatch(err: Exception) -> str:
    """torch's 'Error(s) in loading state_dict' reduced to the parameters it names."""
    lines = [line.strip() for line in str(err).splitlines()[1:] if line.strip()]
    text = "; ".join(lines) if lines else str(err).strip()
    return text[:400] + (" ..." if len(text) > 400 else "")
