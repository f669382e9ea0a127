"""Which checkpoints a logger uploads, and when (``log_model``): shared by the MLflow and W&B loggers.

Lightning's rule, kept here: ``log_model="all"`` uploads after every save of a
``ModelCheckpoint``; ``log_model=True`` uploads once, when the run ends (the files that are left
then), except under ``save_top_k=-1``, where every save is uploaded as it happens (none is ever
deleted); ``False`` uploads nothing. A file is uploaded again only when it changed since
(``last.ckpt`` is rewritten in place). The callback tells the loggers through
``Logger.after_save_checkpoint`` (``framework/callbacks/checkpoint_files.py``), on rank 0.

A checkpoint is uploaded with the aliases ``["latest"]``, or ``["latest", "best"]`` for the
callback's ``best_model_path``, and a metadata mapping (its score, its file name, the callback's
settings). A sharded checkpoint (a folder) is not uploaded: a warning says so. A logger that
sends later (from a background thread) first ``stage``s the file: ``save_top_k`` may delete it,
and ``last.ckpt`` is rewritten, before it is sent.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from framework.errors import ConfigError
from framework.rank_zero import rank_zero_warn

#: the ``ModelCheckpoint`` settings recorded with each uploaded checkpoint
SETTINGS = ("monitor", "mode", "save_last", "save_top_k", "every_n_epochs", "every_n_train_steps")


class CheckpointUploads:
    """``log_model``'s bookkeeping: what was uploaded (path -> modification time) and which
    callbacks wait for the end of the run."""

    def __init__(self, log_model: Any, who: str) -> None:
        if log_model not in (True, False, "all") or not isinstance(log_model, (bool, str)):
            raise ConfigError(f"{who}(log_model={log_model!r}) must be true, false or 'all'")
        self.log_model = log_model
        self.uploaded: dict[str, int] = {}
        self._at_end: dict[int, Any] = {}

    def after_save(self, callback: Any, upload: Callable[[Any], None]) -> None:
        if self.log_model == "all" or (self.log_model is True and getattr(callback, "save_top_k", None) == -1):
            upload(callback)
        elif self.log_model is True:
            self._at_end[id(callback)] = callback

    def at_end(self, upload: Callable[[Any], None]) -> None:
        for callback in self._at_end.values():
            upload(callback)

    def new_files(self, callback: Any) -> list[tuple[str, float | None]]:
        """The callback's checkpoint files not uploaded yet (or changed since), oldest first,
        each with its score; they count as uploaded from here on."""
        candidates: dict[str, float | None] = {}
        if getattr(callback, "last_model_path", ""):
            candidates[callback.last_model_path] = getattr(callback, "current_score", None)
        if getattr(callback, "best_model_path", ""):
            candidates[callback.best_model_path] = getattr(callback, "best_model_score", None)
        candidates.update(getattr(callback, "best_k_models", {}))
        found = []
        for path, score in candidates.items():
            if os.path.isdir(path):
                rank_zero_warn(f"log_model: {path} is a sharded checkpoint (a folder); it is not uploaded")
                continue
            if not os.path.isfile(path):
                continue
            mtime = os.stat(path).st_mtime_ns
            if self.uploaded.get(path, -1) < mtime:
                found.append((mtime, path, score))
        found.sort()
        self.uploaded.update({path: mtime for mtime, path, _ in found})
        return [(path, score) for _, path, score in found]


def aliases(path: str, callback: Any) -> list[str]:
    return ["latest", "best"] if path == getattr(callback, "best_model_path", None) else ["latest"]


def metadata(path: str, score: Any, callback: Any, settings_key: str) -> dict[str, Any]:
    """What Lightning records with an uploaded checkpoint, under fw's setting names."""
    score = score.item() if hasattr(score, "item") else score
    return {"score": score, "original_filename": Path(path).name,
            settings_key: {k: getattr(callback, k) for k in SETTINGS if hasattr(callback, k)}}


def stage(path: str, **texts: Any) -> str:
    """A new hidden folder beside ``path`` that holds it as it is now (a hard link, so no copy;
    a copy where the file system has no hard links) and a ``<key>.yaml``/``.txt`` file for each
    of ``texts`` (``metadata`` mapping as YAML, anything else as its ``str``). The caller
    removes the folder after the upload."""
    import yaml

    staged = tempfile.mkdtemp(prefix=".fw-upload-", dir=os.path.dirname(os.path.abspath(path)))
    target = os.path.join(staged, os.path.basename(path))
    try:
        os.link(path, target)
    except OSError:
        shutil.copy2(path, target)
    for key, value in texts.items():
        name = f"{key}.yaml" if isinstance(value, dict) else f"{key}.txt"
        with open(os.path.join(staged, name), "w", encoding="utf-8") as f:
            if isinstance(value, dict):
                yaml.safe_dump(value, f, default_flow_style=False)
            else:
                f.write(str(value))
    return staged
