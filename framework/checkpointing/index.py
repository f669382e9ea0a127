"""A small index beside the checkpoints of a folder: which run wrote each file.

A restarted (elastic) or requeued (SLURM) job looks for the newest checkpoint its own run wrote
(``search.newest_checkpoint_of_run``). Reading each candidate to learn its run id costs what
the file weighs (gigabytes for a large model), so rank 0 notes, for every checkpoint file it
writes, the entries that search matches on in ``.fw-checkpoints.json`` in the same folder. An
entry is trusted only while the file's size and modification time are the ones noted (a file
written over by something else is read instead); files that are gone (top-k pruning) are dropped
from the index at its next write. The index is rewritten atomically; if it is missing or damaged,
the files are read as before. In object storage (a URL) an entry holds the object's size and
ETag (or upload time), and the index is uploaded after the checkpoint's upload completed.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from framework import paths
from framework.checkpointing.file import new_file_mode

INDEX = ".fw-checkpoints.json"
#: the entries of a checkpoint that the search for a run's own checkpoints matches on
KEYS = ("run_id", "slurm_job_id", "fit_index")


def note(path: str | os.PathLike, checkpoint: dict[str, Any]) -> None:
    """Note ``checkpoint`` (just written to ``path``) in its folder's index. An index that cannot
    be written (a full disk) stays as it was: its entry for ``path``, if any, no longer matches
    the file, which is then read."""
    if paths.is_url(path):  # after the checkpoint's upload (in the background where it is)
        url, noted_keys = os.fspath(path), {key: checkpoint.get(key) for key in KEYS}
        paths.later(url, lambda: _note_url(url, noted_keys))
        return
    path = Path(path)
    entries = {name: entry for name, entry in _read(path.parent).items() if (path.parent / name).is_file()}
    tmp = None
    try:
        stat = path.stat()
        entries[path.name] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
                              **{key: checkpoint.get(key) for key in KEYS}}
        fd, tmp = tempfile.mkstemp(prefix=f"{INDEX}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "w") as f:
            with contextlib.suppress(OSError):  # a file system without modes (vfat) keeps its own
                os.fchmod(f.fileno(), new_file_mode())
            json.dump(entries, f)
        os.replace(tmp, path.parent / INDEX)
    except OSError:
        if tmp is not None and os.path.exists(tmp):
            os.remove(tmp)


def _note_url(url: str, checkpoint: dict[str, Any]) -> None:
    """``note`` in object storage: the index object is uploaded whole after the checkpoint's."""
    folder = paths.dirname(url)
    present = set(paths.listdir(folder))
    entries = {name: entry for name, entry in _read_url(folder).items() if name in present}
    try:
        size, tag = paths.stamp(url)
        # an object's upload time counts seconds: two saves within one are told apart by their order here
        order = 1 + max((entry.get("order", 0) for entry in entries.values() if isinstance(entry, dict)), default=0)
        entries[paths.basename(url)] = {"size": size, "stamp": tag, "order": order,
                                        **{key: checkpoint.get(key) for key in KEYS}}
        paths.write_bytes(paths.join(folder, INDEX), json.dumps(entries).encode())
    except OSError:
        pass


def noted(path: str | os.PathLike, cache: dict[Any, dict]) -> dict[str, Any] | None:
    """What the index says ``path`` holds (its ``KEYS``), if it says so for the file as it is
    now; else None (read the file). ``cache`` keeps each folder's index for one search."""
    if paths.is_url(path):
        url = os.fspath(path)
        folder = paths.dirname(url)
        if folder not in cache:
            cache[folder] = _read_url(folder)
        entry = cache[folder].get(paths.basename(url))
        try:
            if not isinstance(entry, dict) or (entry.get("size"), entry.get("stamp")) != tuple(paths.stamp(url)):
                return None
        except OSError:
            return None
        return {key: entry.get(key) for key in KEYS}
    path = Path(path)
    if path.parent not in cache:
        cache[path.parent] = _read(path.parent)
    entry = cache[path.parent].get(path.name)
    if not isinstance(entry, dict):
        return None
    try:
        stat = path.stat()
    except OSError:
        return None
    if (entry.get("size"), entry.get("mtime_ns")) != (stat.st_size, stat.st_mtime_ns):
        return None
    return {key: entry.get(key) for key in KEYS}


def _read(folder: Path) -> dict[str, Any]:
    try:
        entries = json.loads((folder / INDEX).read_text())
    except (OSError, ValueError):
        return {}
    return entries if isinstance(entries, dict) else {}


def order(path: str, cache: dict[Any, dict]) -> int:
    """Where the index of a URL folder puts ``path`` among its checkpoints (later saves higher;
    0 for a file it does not name): what tells apart two uploads of the same second."""
    if not paths.is_url(path):
        return 0
    folder = paths.dirname(path)
    if folder not in cache:
        cache[folder] = _read_url(folder)
    entry = cache[folder].get(paths.basename(path))
    return int(entry.get("order", 0)) if isinstance(entry, dict) else 0


def _read_url(folder: str) -> dict[str, Any]:
    try:
        entries = json.loads(paths.read_bytes(paths.join(folder, INDEX)))
    except (OSError, ValueError):
        return {}
    return entries if isinstance(entries, dict) else {}
