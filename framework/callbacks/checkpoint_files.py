"""``ModelCheckpoint``'s files: the folder, the name a save point gets, which files it may delete.

The folder is ``<trainer.log_dir>/checkpoints`` (``<default_root_dir>/checkpoints`` without a
logger) unless ``dirpath`` names one; every rank uses rank 0's, checked writable before a fit.

A name comes from the ``filename`` template: ``"{epoch}-{val_acc:.3f}"`` with
``{"epoch": 3, "val_acc": 0.95123}`` gives ``epoch=3-val_acc=0.951`` (a key missing from the
metrics formats as 0; a "/" in a metric's name makes a folder, ``epoch=3-val/acc=0.951``, as in
Lightning: ``auto_insert_metric_name=False`` leaves the names out). A name whose file exists already gets
``-v1``, ``-v2``, ... A file is deleted only by rank 0, and only inside the run's own
checkpoint folder: a file elsewhere (the ``best_model_path`` a resume kept) is another run's.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from framework import paths
from framework.checkpointing.file import check_writable_on_every_rank, remove_stale_temp_files
from framework.checkpointing.sharded import COMMIT_MARK
from framework.rank_zero import rank_zero_info

if TYPE_CHECKING:
    from framework.trainer import Trainer


def run_folder(trainer: Trainer) -> str:
    """The run's checkpoint folder, rank 0's on every rank (all of them write to and prune it)."""
    root = version_folder(trainer) or trainer.default_root_dir
    return trainer.strategy.broadcast(paths.real(paths.join(root, "checkpoints")))


def version_folder(trainer: Trainer) -> str | None:
    """The run folder that holds ``checkpoints/`` (Lightning's): ``trainer.log_dir``, or the
    first logger's version folder where its log folder lies elsewhere (a TensorBoardLogger's
    ``sub_dir``)."""
    first = trainer.loggers[0] if trainer.loggers else None
    if getattr(first, "sub_dir", None):
        return first.version_dir  # type: ignore[union-attr]
    return trainer.log_dir


def tell_loggers(trainer: Trainer, callback: object) -> None:
    """After a save, on rank 0: every logger's ``after_save_checkpoint(callback)``, Lightning's
    hook (the MLflow and W&B loggers upload checkpoints from it with ``log_model``)."""
    if trainer.is_global_zero:
        for logger in trainer.loggers:
            logger.after_save_checkpoint(callback)


def prepare_folder(folder: str, trainer: Trainer) -> None:
    """Before a fit: every rank can write to ``folder`` (checked now, not at the first save),
    and rank 0 removes what killed writes left there."""
    check_writable_on_every_rank(folder, "ModelCheckpoint dirpath", trainer.strategy)
    if trainer.is_global_zero:
        for removed in remove_stale_temp_files(folder):
            if removed.endswith((".partial", ".ckpt")):
                rank_zero_info(f"fw: removed {removed}: a sharded checkpoint whose save did not finish")


def format_name(template: str, metrics: Mapping[str, float], auto_insert_metric_name: bool,
                equals: str = "=") -> str:
    """``template`` filled in from ``metrics``; ``auto_insert_metric_name`` writes
    ``{epoch}`` as ``epoch=3`` (with ``equals``) rather than ``3``."""
    values = dict(metrics)
    # Longest first, so that "{val/acc}" is not rewritten inside "{val/acc_top5}".
    for group in sorted(set(re.findall(r"(\{.*?)[:}]", template)), key=len, reverse=True):
        key = group[1:]
        label = key + equals if auto_insert_metric_name else ""
        # "{0[key]}" lets keys hold "/" and "." which plain format fields cannot.
        template = template.replace(group, f"{label}{{0[{key}]")
        values.setdefault(key, 0)
    return template.format(values)


def unused_path(path_for: Callable[[int | None], str], reuse: str | None, first_version: int) -> str:
    """``path_for(None)``, or, while that file exists (and is not ``reuse``), the path of the
    next version from ``first_version`` on."""
    filepath = path_for(None)
    version = first_version
    while paths.exists(filepath) and filepath != reuse:
        filepath = path_for(version)
        version += 1
    return filepath


def link(trainer: Trainer, target: str, linkpath: str) -> None:
    """``linkpath`` made a relative symbolic link to ``target`` on rank 0 (a copy where links cannot
    be made), replacing what was there; every rank waits for it (Lightning's ``save_last="link"``)."""
    if trainer.is_global_zero and os.path.abspath(target) != os.path.abspath(linkpath):
        if os.path.islink(linkpath) or os.path.isfile(linkpath):
            os.remove(linkpath)
        elif os.path.isdir(linkpath):
            shutil.rmtree(linkpath)
        try:
            os.symlink(os.path.relpath(target, os.path.dirname(linkpath)), linkpath)
        except OSError:
            (shutil.copytree if os.path.isdir(target) else shutil.copy)(target, linkpath)
    trainer.strategy.barrier()


def remove_if_ours(filepath: str, folder: str, is_global_zero: bool) -> None:
    """Delete ``filepath`` on rank 0 if it lies inside ``folder`` (as Lightning does, a file of
    another run is not ours to delete); a file already gone is no error."""
    if not paths.real(filepath).startswith(paths.join(paths.real(folder), "")):
        return
    if is_global_zero and paths.is_url(filepath):  # a sharded folder stops looking complete before a shard goes
        paths.remove(paths.join(filepath, COMMIT_MARK))
        paths.remove(filepath)
    elif is_global_zero:
        try:
            if os.path.isdir(filepath):  # a sharded checkpoint
                shutil.rmtree(filepath)
            else:
                os.remove(filepath)
        except FileNotFoundError:
            pass


def write_yaml(data: Mapping, path: str | os.PathLike) -> None:
    import yaml

    paths.write_text(os.fspath(path), yaml.dump(dict(data)))
