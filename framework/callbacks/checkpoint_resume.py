"""What a resumed ``ModelCheckpoint`` takes over from the checkpoint it resumes from.

A checkpoint carries its ModelCheckpoint's bookkeeping: the folder it saved into, the top-k
files and scores, ``last_model_path``. That bookkeeping names files, so it can only go on where
those files are. It does when the checkpoint saved into this run's folder (Lightning's rule), or,
without an explicit ``dirpath``, into another version folder of this run's logger that still
exists (the run then keeps saving and pruning there, so ``save_top_k`` holds across resumes).

A checkpoint written anywhere else (another ``default_root_dir``, a folder deleted since), or
with another monitor, is only a starting point: the run saves into its own folder, never into
the old one (nor re-creates it), restores ``best_model_path`` alone (as Lightning does), and says
once, in one line, what it did not restore.
"""

from __future__ import annotations

from typing import Any

import torch

from framework import paths

BOOKKEEPING = ("best_model_score", "best_k_models", "kth_best_model_path", "kth_value", "last_model_path")


def why_not_continued(state: dict, *, monitor: str | None, mode: str, dirpath: str | None, dirpath_given: bool,
                      experiment_dir: str | None) -> str | None:
    """Why the bookkeeping in ``state`` cannot go on in this run (a phrase for the warning), or
    None if it can.

    Args:
        state: The ModelCheckpoint state saved in the checkpoint.
        monitor, mode: This callback's.
        dirpath: This run's checkpoint folder (a real path).
        dirpath_given: Whether the user chose ``dirpath`` (then only that folder counts).
        experiment_dir: ``<save_dir>/<name>`` of this run's logger, which holds its version
            folders; None without a logger.
    """
    saved_dir = state.get("dirpath")
    if state.get("monitor") != monitor or state.get("mode", mode) != mode:
        return (f"it ranked by monitor={state.get('monitor')!r}, mode={state.get('mode')!r} and this run by "
                f"monitor={monitor!r}, mode={mode!r}")
    if saved_dir is None:
        return "it recorded no folder"
    saved_dir = paths.real(saved_dir)
    if saved_dir == dirpath:
        return None
    if not paths.isdir(saved_dir):
        return f"its folder {saved_dir!r} no longer exists"
    other_version = (not dirpath_given and experiment_dir is not None
                     and paths.dirname(paths.dirname(saved_dir)) == experiment_dir)
    return None if other_version else f"it saved into {saved_dir!r}, not this run's folder"


def not_restored_warning(state: dict, why: str, dirpath: str | None) -> str:
    """One line: why the old run's bookkeeping does not go on, where this run saves, and what
    of that bookkeeping is dropped."""
    dropped = [name for name in BOOKKEEPING if state.get(name) not in (None, "", {})]
    if "best_k_models" in dropped:
        n = len(state["best_k_models"])
        dropped[dropped.index("best_k_models")] = f"best_k_models ({n} file{'s' if n != 1 else ''})"
    lost = f"Not restored: {', '.join(dropped)}. " if dropped else ""
    return (f"ModelCheckpoint: the resumed checkpoint's top-k does not go on here: {why}; this run saves into "
            f"{dirpath!r}. {lost}Only best_model_path is restored. HINT: to continue that top-k, resume with "
            "that run's default_root_dir (or the same ModelCheckpoint dirpath and monitor)")


def restored_bookkeeping(state: dict) -> dict[str, Any]:
    """The bookkeeping in ``state`` as the callback's attributes: its folder, the top-k files and
    scores (tensors, as Lightning's; fw's checkpoints before 2026-12-06 hold floats), the last file."""
    def tensor(score: Any) -> torch.Tensor | None:
        return None if score is None else torch.as_tensor(score)

    return {"dirpath": paths.real(state["dirpath"]), "best_model_score": tensor(state.get("best_model_score")),
            "best_k_models": {path: tensor(score) for path, score in state.get("best_k_models", {}).items()},
            "kth_best_model_path": state.get("kth_best_model_path", ""), "kth_value": tensor(state.get("kth_value")),
            "last_model_path": state.get("last_model_path", "")}
