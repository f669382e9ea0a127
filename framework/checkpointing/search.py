"""Which checkpoint file a run means when it names none exactly: ``ckpt_path="last"`` (the
newest ``last*.ckpt``, or the newest checkpoint of the latest run), ``"best"`` as an earlier
run recorded it, and a restarted or requeued job's own newest checkpoint. The folders may be
local or URLs (``paths.py``); in object storage only whole objects are listed (an upload that
did not complete is no object), and ``newest_checkpoint_of_run`` trusts the index, uploaded last."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from framework import paths
from framework.checkpointing import index as checkpoint_index
from framework.checkpointing import sharded
from framework.checkpointing.file import read_values
from framework.errors import CheckpointError


def _in_dirs(dirs: Sequence[str | None], pattern: str) -> list[str]:
    """The files matching ``pattern`` in the checkpoint dirs (a None among them is skipped)."""
    return [p for d in dirs if d for p in paths.glob(paths.join(d, pattern))]


def _written(path: str) -> float | None:
    """When the checkpoint at ``path`` was completed; None for a sharded folder in object storage
    whose save did not finish (no commit mark: a folder there is written in place, and a local one
    only appears under its name once complete)."""
    if paths.is_url(path) and paths.isdir(path):
        return paths.modified(paths.join(path, sharded.COMMIT_MARK)) if sharded.is_committed(path) else None
    return paths.modified(path)


def _newest(found: list[str]) -> str | None:
    """The newest complete one of ``found`` by modification time (in object storage, whole
    seconds: the folder's index orders the uploads of one second)."""
    indexes: dict[Any, dict] = {}
    dated = [(when, checkpoint_index.order(path, indexes), path) for path in found
             if (when := _written(path)) is not None]
    return max(dated)[2] if dated else None


def newest_last_checkpoint(dirs: Sequence[str | None]) -> str | None:
    """The newest ``last*.ckpt`` in the checkpoint dirs, or None."""
    return _newest(_in_dirs(dirs, "last*.ckpt"))


def find_last_checkpoint(dirs: Sequence[str | None], root: str) -> str | None:
    """``ckpt_path="last"``: the newest ``last*.ckpt`` in the checkpoint dirs, else under root;
    without any (``save_last`` off, ModelCheckpoint's default), the newest checkpoint under
    root: the one the latest run wrote last."""
    for pattern in ("last*.ckpt", "*.ckpt"):
        found = _newest(_in_dirs(dirs, pattern) or paths.glob(paths.join(root, "**", pattern), recursive=True))
        if found is not None:
            return found
    return None


def best_recorded_under(dirs: Sequence[str | None], root: str) -> tuple[str, str] | None:
    """``ckpt_path="best"`` for a Trainer that saved nothing yet (``fw test conf.yaml
    ckpt_path=best`` after ``fw fit``): the best checkpoint a ModelCheckpoint recorded in the
    newest checkpoint under ``dirs``/``root`` (a monitored one first), if that file still
    exists; with the checkpoint it was read from."""
    newest = find_last_checkpoint(dirs, root)
    if newest is None:
        return None
    states = read_values(newest).get("callbacks") or {}
    recorded = sorted((state.get("monitor") is None, state.get("best_model_path") or "")
                      for key, state in states.items() if key.startswith("ModelCheckpoint") and isinstance(state, dict))
    found = [path for _, path in recorded if path and paths.exists(path)]
    return (found[0], newest) if found else None


def newest_checkpoint_of_run(dirs: Sequence[str | None], match: dict[str, Any]) -> str | None:
    """The newest complete checkpoint (``*.ckpt``, newest first by modification time) under
    ``dirs`` whose entries equal ``match`` (the run's id and which fit of the program it is),
    as the folders' indexes say (``index.py``); a file they do not vouch for is read."""
    found = {p for d in dirs if d and paths.isdir(d) for p in paths.glob(paths.join(d, "**", "*.ckpt"), recursive=True)}
    dated = []
    indexes: dict[Any, dict] = {}
    for path in found:
        try:
            when = _written(path)
        except OSError:  # removed meanwhile (top-k pruning)
            continue
        if when is not None:
            dated.append((when, checkpoint_index.order(path, indexes), path))
    indexed = set(match) <= set(checkpoint_index.KEYS)  # the index holds every entry asked for
    for *_, path in sorted(dated, reverse=True):
        checkpoint = checkpoint_index.noted(path, indexes) if indexed else None
        try:
            checkpoint = checkpoint if checkpoint is not None else read_values(path)
        except CheckpointError:
            continue  # not one of ours, damaged, incomplete or removed meanwhile: an older one will do
        if all(checkpoint.get(key) == value for key, value in match.items()):
            return path
    return None
