"""The checkpoint file: what a run needs to continue bit for bit, written atomically, read safely.

A checkpoint holds the module's weights, optimiser and scheduler states, the GradScaler, loop
counters, callback states, hyperparameters and the RNG states of every rank (Python, NumPy,
torch, CUDA), including the states at the start of the epoch so that a mid-epoch checkpoint
resumes with the same data order. Files are written to a temporary file in the same directory,
fsynced and renamed, so a crash never leaves a half-written checkpoint under the real name.
Loading uses ``torch.load(weights_only=True)``: a checkpoint cannot run code. A sharded
checkpoint (a folder, ``sharded.py``) is read whole by the same ``load_checkpoint``. Also here:
whether a checkpoint folder is writable, the removal of what killed writes left, and the
hyperparameters as a checkpoint keeps them.
"""

from __future__ import annotations

import contextlib
import glob
import io
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from framework import paths
from framework.checkpointing import sharded
from framework.errors import CheckpointError, ConfigError

if TYPE_CHECKING:
    from framework.strategies import Strategy

FORMAT_VERSION = 1


def atomic_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save`` to a temp file beside ``path``, fsync, then rename over ``path``; to a URL
    (``s3://...``), one upload that appears whole or not at all (``paths.write_bytes``), in the
    background where its bucket uploads there (``paths.upload_in_background``)."""
    if paths.is_url(path):  # serialised now (the state goes on changing), uploaded now or in the background
        buffer = io.BytesIO()
        torch.save(obj, buffer)
        url, data = os.fspath(path), buffer.getvalue()
        paths.later(url, lambda: paths.write_bytes(url, data), exists=True, one_at_a_time=True)
        return
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
    """Read a checkpoint written by fw, a file or a sharded folder (``sharded.py``); a missing,
    corrupt or truncated one is a CheckpointError and is left untouched."""
    if paths.is_url(path):
        return _load_url(os.fspath(path), map_location)
    path = Path(path)
    if sharded.is_sharded(path):
        return sharded.with_full_tensors(read_fw_file(path), path, map_location)
    if path.is_dir():
        inside = sorted(p.name for p in path.glob("*.ckpt"))
        hint = f"; it holds {', '.join(inside[:5])}" if inside else "; it holds no .ckpt file"
        raise CheckpointError(f"ckpt_path '{path}' is a directory: give a checkpoint file in it{hint}")
    if not path.is_file():
        raise CheckpointError(f"checkpoint '{path}' does not exist; check ckpt_path")
    return _checked(path, map_location)


def _load_url(url: str, map_location: Any) -> dict:
    """``load_checkpoint`` of a file or a sharded folder in object storage."""
    if sharded.is_sharded(url):
        return sharded.with_full_tensors(read_fw_file(url), url, map_location)
    if paths.isdir(url) and not paths.isfile(url):
        inside = sorted(name for name in paths.listdir(url) if name.endswith(".ckpt"))
        hint = f"; it holds {', '.join(inside[:5])}" if inside else "; it holds no .ckpt file"
        raise CheckpointError(f"ckpt_path '{url}' is a folder: give a checkpoint file in it{hint}")
    try:
        data = paths.read_bytes(url)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint '{url}' does not exist; check ckpt_path") from None
    return _checked(io.BytesIO(data), map_location, url)


def _checked(source: Any, map_location: Any, name: Any = None) -> dict:
    """The checkpoint ``torch.load`` reads from ``source`` (a path or a buffer), checked."""
    path = source if name is None else name
    try:
        checkpoint = torch.load(source, map_location=map_location, weights_only=True)
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


def read_fw_file(path: str | os.PathLike) -> dict[str, Any]:
    """The ``fw_state.pt`` of the complete sharded checkpoint at ``path`` (no tensor of the
    model read).

    Raises:
        CheckpointError: the folder has no commit mark (a save that did not finish) or no fw_state.pt.
    """
    return load_checkpoint(sharded.committed_fw_file(path))


def read_values(path: str | os.PathLike) -> dict:
    """A checkpoint's entries without its sharded tensors (a sharded checkpoint's ``fw_state.pt``):
    what finding a run's checkpoint needs to read."""
    return read_fw_file(path) if sharded.is_sharded(path) else load_checkpoint(path)


def writable_error(path: str | os.PathLike, what: str) -> str | None:
    """Why ``path`` cannot be created (if needed) and written, or None. A probe file in the
    nearest folder that exists answers without creating anything: a read-only file system, a
    file in the way or a missing permission is named with ``what`` and the path. A folder that
    ``os.access`` finds writable needs no probe (access(2) answers for read-only file systems
    too); the probe names the reason when it does not. A URL: its bucket exists and takes
    the credentials (``paths.check_storage``)."""
    if paths.is_url(path):
        try:
            paths.check_storage(os.fspath(path), what)
        except ConfigError as err:
            return str(err)
        return None
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


def wait_for_uploads_on_every_rank(strategy: Strategy) -> None:
    """``paths.wait_for_uploads`` on every rank (rank 0 writes the checkpoints), its outcome shared:
    a failed background upload is the same ``CheckpointError`` on every rank, never one rank
    raising while the others wait for it in the next collective (call it on every rank)."""
    import torch.distributed as dist

    error = None
    try:
        paths.wait_for_uploads()
    except CheckpointError as err:
        error = str(err)
    if strategy.is_distributed and dist.is_available() and dist.is_initialized():  # the group is up
        error = next((found for found in strategy.all_gather_object(error) if found), None)
    if error:
        failure = CheckpointError(error)
        failure.alike_on_every_rank = True  # the same line on every rank: rank 0 prints it
        raise failure


def remove_stale_temp_files(directory: str | os.PathLike) -> list[str]:
    """Remove what killed writes left in ``directory`` (``atomic_save``'s ``.NAME.*.tmp``
    files, a sharded save's ``.NAME.partial`` and ``.NAME.old`` folders, a logger's ``.fw-upload-*``
    staging folders of a checkpoint upload; in object storage, a sharded folder without its
    commit mark); call it when no write can be under way there. Returns the removed paths."""
    import shutil

    removed = []
    folder = os.fspath(directory)
    if paths.is_url(folder):  # an upload that did not complete left no object; a moved one, its temp name
        for tmp in paths.glob(paths.join(folder, ".*.tmp")):
            paths.remove(tmp)
            removed.append(tmp)
        for candidate in paths.glob(paths.join(folder, "*.ckpt")):  # a sharded save there is written in place
            if paths.isdir(candidate) and not sharded.is_committed(candidate):
                paths.remove(candidate)
                removed.append(candidate)
        return removed
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


def state_dict_mismatch(err: Exception) -> str:
    """torch's 'Error(s) in loading state_dict' reduced to the parameters it names."""
    lines = [line.strip() for line in str(err).splitlines()[1:] if line.strip()]
    text = "; ".join(lines) if lines else str(err).strip()
    return text[:400] + (" ..." if len(text) > 400 else "")
