"""A small index beside the checkpoints of a folder: which run wrote each file.

A restarted (elastic) or requeued (SLURM) job looks for the newest checkpoint its own run wrote
(``search.newest_checkpoint_of_run``). Reading each candidate to learn its run id costs what
the file weighs (gigabytes for a large model), so rank 0 notes, for every checkpoint file it
writes, the entries that search matches on in ``.fw-checkpoints.json`` in the same folder. An
entry is trusted only while the file's size and modification time are the ones noted (a file
written over by something else is read instead); files that are gone (top-k pruning) are dropped
from the index at its next write. The index is rewritten atomically; if it is missing or damaged,
the files are read as before.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from framework.checkpointing.file import new_file_mode

INDEX = ".fw-checkpoints.json"
#: the entries of a checkpoint that the search for a run's own checkpoints matches on
KEYS = ("run_id", "slurm_job_id", "fit_index")


def note(path: str | os.PathLike, checkpoint: dict[str, Any]) -> None:
    """Note ``checkpoint`` (just written to ``path``) in its folder's index. An index that cannot
    be written (a full disk) stays as it was: its entry for ``path``, if any, no longer matches
    the file, which is then read."""
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


def noted(path: str | os.PathLike, cache: dict[Path, dict]) -> dict[str, Any] | None:
    """What the index says ``path`` holds (its ``KEYS``), if it says so for the file as it is
    now; else None (read the file). ``cache`` keeps each folder's index for one search."""
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
