"""Save checkpoints during training: the best ``k`` by a monitored metric, and/or the last one.

Semantics follow Lightning's ``ModelCheckpoint``:

* By default a checkpoint is saved at the end of every training epoch (after its validation, so
  validation metrics can be monitored), or at the end of each validation run when validation
  does not run once per epoch; ``every_n_epochs``, ``every_n_train_steps`` and
  ``save_on_train_epoch_end`` change when (``checkpoint_schedule.py``).
* ``filename`` is a template: ``"{epoch}-{val_acc:.3f}"`` gives ``epoch=3-val_acc=0.951.ckpt``;
  a name already on disk gets ``-v1``, ``-v2`` (``checkpoint_files.py``).
* ``save_top_k`` keeps the ``k`` best files by ``monitor`` (-1 keeps all, 0 none); without a
  monitor, ``save_top_k=1`` keeps only the latest. ``save_last`` also keeps ``last.ckpt``, the
  checkpoint of the latest save point (Lightning 2.6 updates it only with a top-k save).
* A resumed run continues the checkpoint's top-k only where its files are (``checkpoint_resume.py``);
  a checkpoint written elsewhere starts this run's folder afresh. Files outside it are never deleted.

Distributed runs: every rank takes the same decision (the Trainer syncs metrics, and the
decision is reduced once more), every rank calls ``trainer.save_checkpoint`` (it gathers
state, then rank 0 writes), and only rank 0 deletes files.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any

import torch

import framework.callbacks.checkpoint_files as files
import framework.callbacks.checkpoint_schedule as schedule
from framework import paths
from framework.callbacks.base import Callback
from framework.callbacks.checkpoint_resume import not_restored_warning, restored_bookkeeping, why_not_continued
from framework.errors import ConfigError
from framework.intervals import every
from framework.rank_zero import rank_zero_info, rank_zero_warn

if TYPE_CHECKING:
    from framework.module import TrainModule
    from framework.trainer import Trainer


class ModelCheckpoint(Callback):
    """Save checkpoints of the run, keeping the best ``save_top_k`` by ``monitor``.

    Args:
        dirpath: Folder for the checkpoints; default ``<trainer.log_dir>/checkpoints``, or
            ``<default_root_dir>/checkpoints`` without a logger. A URL (``s3://bucket/ck``) is written
            through fsspec, with the Trainer's ``storage_options`` or the environment's credentials.
        filename: Name template without extension, default ``"{epoch}-{step}"``.
        monitor: Key of ``trainer.callback_metrics`` to rank checkpoints by; ``None`` ranks by recency.
        mode: ``"min"`` or ``"max"``: which way is better for ``monitor``.
        save_top_k: How many of the best checkpoints to keep; -1 all, 0 none.
        save_last: Also write ``last.ckpt`` at every save point (and at the end of a fit that reached none, as
            Lightning does); ``"latest"``: the same, chosen (no note of Lightning's rule); ``"link"``: a link.
        every_n_epochs: Save every this many epochs (default 1 unless ``every_n_train_steps`` is given).
        every_n_train_steps: Save every this many optimizer steps (0 or ``None``: never).
        save_on_train_epoch_end: Save epoch checkpoints at the end of the training epoch (``True``) or at the end
            of each validation run (``False``); ``None`` (default) decides per run as Lightning does.
        auto_insert_metric_name: ``"{epoch}"`` -> ``"epoch=3"`` rather than ``"3"``.
        verbose: a line at each save.
        enable_version_counter: ``False`` replaces a file of the same name (no ``-v1``).
        save_weights_only: Lightning's (``trainer/weights_only.py``).
        train_time_interval, save_on_exception: refused unless off.

    Raises:
        ConfigError: On an invalid ``mode``, ``save_top_k``, interval or option, and when ``monitor``
            is missing from ``trainer.callback_metrics`` once validation has run.
    """

    CHECKPOINT_JOIN_CHAR = "-"
    CHECKPOINT_EQUALS_CHAR = "="
    CHECKPOINT_NAME_LAST = "last"
    FILE_EXTENSION = ".ckpt"
    STARTING_VERSION = 1

    def __init__(self, dirpath: str | os.PathLike | None = None, filename: str | None = None,
                 monitor: str | None = None, verbose: bool = False, save_last: bool | str | None = None,
                 save_top_k: int = 1, save_on_exception: bool = False, save_weights_only: bool = False,
                 mode: str = "min", auto_insert_metric_name: bool = True, every_n_train_steps: int | None = None,
                 train_time_interval: Any = None, every_n_epochs: int | None = None,
                 save_on_train_epoch_end: bool | None = None, enable_version_counter: bool = True) -> None:
        schedule.check_arguments(monitor, mode, save_top_k, save_on_exception, train_time_interval, save_last)
        self.every_n_epochs, self.every_n_train_steps = schedule.save_intervals(every_n_epochs, every_n_train_steps)
        self.verbose, self.enable_version_counter = verbose, enable_version_counter
        self.save_weights_only = save_weights_only  # the files hold the weights alone; no fit resumes from them
        self._dirpath_given = dirpath is not None
        self.dirpath = (paths.real(_expand_user(paths.storage_path(dirpath, "ModelCheckpoint dirpath")))
                        if dirpath is not None else None)
        self.filename, self.monitor, self.mode = filename, monitor, mode
        self.save_top_k, self.save_last = save_top_k, save_last
        self.save_on_train_epoch_end = save_on_train_epoch_end  # None: Lightning's rule (checkpoint_schedule.py)
        self.auto_insert_metric_name = auto_insert_metric_name

        # Bookkeeping, saved in checkpoints so that a resumed run carries on with it (scores as tensors, as Lightning's)
        self.best_k_models: dict[str, torch.Tensor] = {}
        self.kth_best_model_path = self.best_model_path = self.last_model_path = ""
        self.kth_value: torch.Tensor | None = torch.tensor(math.inf if mode == "min" else -math.inf)
        self.best_model_score: torch.Tensor | None = None
        self.current_score: torch.Tensor | None = None  # the monitored value of the latest top-k save
        self._last_global_step_saved = 0  # also: never save an untrained model at step 0
        self._fitting = self._validation_has_run = self._warned_missing = self._saved_in_this_fit = False
        self._last_saved = ""  # the newest file this callback saved: what save_last="link" links to
        self._experiment_dir: str | None = None  # <save_dir>/<name> of this run's logger

    @property
    def state_key(self) -> str:
        # Several ModelCheckpoints in one Trainer must not overwrite each other's state.
        return (f"ModelCheckpoint{{'monitor': {self.monitor!r}, 'mode': {self.mode!r}, "
                f"'every_n_train_steps': {self.every_n_train_steps}, 'every_n_epochs': {self.every_n_epochs}}}")

    # -- hooks ----------------------------------------------------------------------------
    def setup(self, trainer: Trainer, module: TrainModule, stage: str) -> None:
        self._fitting = stage == "fit"
        self._saved_in_this_fit = False
        # <save_dir>/<name>/version_N: only a logger's run folder has versions (without one the run folder is
        # default_root_dir, and a folder beside it is another run's, not another version of this one)
        log_dir = None if self._dirpath_given or not trainer.loggers else files.version_folder(trainer)
        self._experiment_dir = paths.dirname(paths.real(log_dir)) if log_dir else None
        if self.dirpath is None:
            self.dirpath = files.run_folder(trainer)
        if self.save_last == "link" and paths.is_url(self.dirpath):
            raise ConfigError(f"ModelCheckpoint(save_last='link'): '{self.dirpath}' is object storage, which has no "
                              "links; use save_last=True (a last.ckpt of its own)")
        if self._fitting and not trainer.fast_dev_run:  # a dev run saves nothing (Lightning's)
            files.prepare_folder(self.dirpath, trainer)

    def on_validation_end(self, trainer: Trainer, module: TrainModule) -> None:
        if trainer.sanity_checking or not self._fitting:
            return
        self._validation_has_run = True
        if not schedule.saves_on_train_epoch_end(self.save_on_train_epoch_end, trainer) and not self._skip(trainer):
            self._save_epoch_checkpoints(trainer)

    def on_train_epoch_end(self, trainer: Trainer, module: TrainModule) -> None:
        if schedule.saves_on_train_epoch_end(self.save_on_train_epoch_end, trainer) and not self._skip(trainer):
            self._save_epoch_checkpoints(trainer)

    def on_train_end(self, trainer: Trainer, module: TrainModule) -> None:
        # Lightning's promise: with save_last, a fit that reached no save point still leaves last.ckpt.
        if self.save_last and self._fitting and not self._saved_in_this_fit and not self._skip(trainer):
            self._save_last_checkpoint(trainer, schedule.monitor_candidates(trainer))

    def on_train_batch_end(self, trainer: Trainer, module: TrainModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if not every(self.every_n_train_steps, trainer.global_step) or self._skip(trainer):
            return
        candidates = schedule.monitor_candidates(trainer)
        self._save_topk_checkpoint(trainer, candidates)
        self._save_last_checkpoint(trainer, candidates)

    # -- when (the rules: checkpoint_schedule.py) -----------------------------------------
    def _skip(self, trainer: Trainer) -> bool:
        # With gradient accumulation several batches share one global_step: save once.
        return trainer.sanity_checking or bool(trainer.fast_dev_run) or self._last_global_step_saved == trainer.global_step

    def _save_epoch_checkpoints(self, trainer: Trainer) -> None:
        candidates = schedule.monitor_candidates(trainer)
        if every(self.every_n_epochs, trainer.current_epoch + 1):
            self._save_topk_checkpoint(trainer, candidates)
        self._save_last_checkpoint(trainer, candidates)

    # -- top-k ----------------------------------------------------------------------------
    def _save_topk_checkpoint(self, trainer: Trainer, candidates: dict[str, float]) -> None:
        if self.save_top_k == 0:
            return
        if self.monitor is None:
            self._save_none_monitor_checkpoint(trainer, candidates)
            return
        current = candidates.get(self.monitor)
        if current is None:
            self._missing_monitor(trainer, self.monitor)
            return
        if math.isnan(current):  # a NaN is never "better"; store it as the worst value
            current = math.inf if self.mode == "min" else -math.inf
        decision = self.check_monitor_top_k(current)
        # Metrics are synced already; reducing makes divergence between ranks impossible.
        if trainer.strategy.reduce_boolean_decision(decision, all=True):
            self._update_best_and_save(current, trainer, candidates)

    def check_monitor_top_k(self, current: float) -> bool:
        """Would a checkpoint scoring ``current`` enter the top ``save_top_k``?"""
        if self.save_top_k == -1 or len(self.best_k_models) < self.save_top_k:
            return True
        kth = float(self.best_k_models[self.kth_best_model_path])
        return current < kth if self.mode == "min" else current > kth

    def _update_best_and_save(self, current: float, trainer: Trainer, candidates: dict[str, float]) -> None:
        k = len(self.best_k_models) + 1 if self.save_top_k == -1 else self.save_top_k
        del_filepath = None
        if len(self.best_k_models) == k and k > 0:
            del_filepath = self.kth_best_model_path
            self.best_k_models.pop(del_filepath)

        filepath = self._unused_filepath(trainer, candidates, reuse=del_filepath)
        self.best_k_models[filepath] = self.current_score = schedule.score(trainer, self.monitor, current)
        worst, best = (max, min) if self.mode == "min" else (min, max)
        if len(self.best_k_models) == k:
            self.kth_best_model_path = worst(self.best_k_models, key=self.best_k_models.__getitem__)
            self.kth_value = self.best_k_models[self.kth_best_model_path]
        self.best_model_path = best(self.best_k_models, key=self.best_k_models.__getitem__)
        self.best_model_score = self.best_k_models[self.best_model_path]

        self._save_checkpoint(trainer, filepath)
        if del_filepath:
            self._remove_checkpoint(trainer, del_filepath, keep=filepath)

    def _save_none_monitor_checkpoint(self, trainer: Trainer, candidates: dict[str, float]) -> None:
        filepath = self._unused_filepath(trainer, candidates, reuse=self.best_model_path)
        previous, self.best_model_path = self.best_model_path, filepath
        self._save_checkpoint(trainer, filepath)
        if self.save_top_k == 1 and previous:
            self._remove_checkpoint(trainer, previous, keep=filepath)

    def _save_last_checkpoint(self, trainer: Trainer, candidates: dict[str, float]) -> None:
        if not self.save_last:
            return
        # an earlier run's last.ckpt is kept (last-v1.ckpt is written), this run's own is replaced
        filepath = self._unused_filepath(trainer, candidates, self.last_model_path, self.CHECKPOINT_NAME_LAST)
        previous, self.last_model_path = self.last_model_path, filepath
        if self.save_last == "link" and self._last_saved and self.save_top_k != 0:
            files.link(trainer, self._last_saved, filepath)  # Lightning's: to the newest file saved
        else:
            self._save_checkpoint(trainer, filepath)  # overwritten in place, atomically
        if previous:
            self._remove_checkpoint(trainer, previous, keep=filepath)

    def _missing_monitor(self, trainer: Trainer, monitor: str) -> None:
        message = schedule.missing_monitor_message(monitor, trainer)
        if self._validation_has_run:
            raise ConfigError(message)
        # Before the first validation a validation metric cannot be there yet.
        if not self._warned_missing:
            self._warned_missing = True
            rank_zero_warn(message + " (Checked again once validation has run.)")

    # -- files ----------------------------------------------------------------------------
    def format_checkpoint_name(self, metrics: dict[str, float], filename: str | None = None,
                               ver: int | None = None) -> str:
        """The checkpoint path for ``metrics`` (``<dirpath>/epoch=3-val_acc=0.951.ckpt``, see
        ``checkpoint_files.format_name``); ``ver`` appends ``-v<ver>``."""
        name = files.format_name(filename or self.filename or "{epoch}" + self.CHECKPOINT_JOIN_CHAR + "{step}",
                                 metrics, self.auto_insert_metric_name, self.CHECKPOINT_EQUALS_CHAR)
        if ver is not None:
            name += f"{self.CHECKPOINT_JOIN_CHAR}v{ver}"
        return paths.join(self.dirpath or "", name + self.FILE_EXTENSION)

    def _folder(self) -> str:
        assert self.dirpath is not None, "ModelCheckpoint.setup() sets dirpath before anything is saved or removed"
        return self.dirpath

    def _unused_filepath(self, trainer: Trainer, candidates: dict[str, float], reuse: str | None,
                         filename: str | None = None) -> str:
        """Format the name; if that file exists (and is not ``reuse``), add ``-v1``, ``-v2``..."""
        filepath = files.unused_path(lambda ver: self.format_checkpoint_name(candidates, filename, ver), reuse,
                                     self.STARTING_VERSION) if self.enable_version_counter \
            else self.format_checkpoint_name(candidates, filename=filename)  # Lightning's: that file is replaced
        # Ranks may see different file systems: everyone uses rank 0's answer.
        return trainer.strategy.broadcast(filepath)

    def _save_checkpoint(self, trainer: Trainer, filepath: str) -> None:
        self._last_global_step_saved, self._saved_in_this_fit, self._last_saved = trainer.global_step, True, filepath
        if trainer.is_global_zero and not paths.is_url(filepath):  # a bucket has no folders to make
            os.makedirs(os.path.dirname(filepath), exist_ok=True)
        trainer.save_checkpoint(filepath, self.save_weights_only)  # on every rank: it gathers state, rank 0 writes
        if self.verbose:
            rank_zero_info(f"Epoch {trainer.current_epoch}, global step {trainer.global_step}: saved {filepath}")
        files.tell_loggers(trainer, self)  # Lightning's logger.after_save_checkpoint (log_model uploads)

    def _remove_checkpoint(self, trainer: Trainer, filepath: str, keep: str) -> None:
        if filepath == keep or filepath in (self.best_model_path, self.last_model_path) \
                or filepath in self.best_k_models:
            return  # still referenced
        files.remove_if_ours(filepath, self._folder(), trainer.is_global_zero)

    def to_yaml(self, filepath: str | os.PathLike | None = None) -> None:
        """``best_k_models`` (path: score) as YAML, by default ``<dirpath>/best_k_models.yaml`` (Lightning's)."""
        files.write_yaml({path: score.item() for path, score in self.best_k_models.items()},
                         filepath or paths.join(self._folder(), "best_k_models.yaml"))

    def file_exists(self, filepath: str | os.PathLike, trainer: Trainer) -> bool:
        """Does ``filepath`` exist on rank 0? Every rank gets rank 0's answer (Lightning's)."""
        return trainer.strategy.reduce_boolean_decision(trainer.is_global_zero and paths.exists(os.fspath(filepath)), all=False)

    # -- state ----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "monitor": self.monitor, "mode": self.mode, "dirpath": self.dirpath,
            "best_model_path": self.best_model_path, "best_model_score": self.best_model_score,
            "current_score": self.current_score, "best_k_models": dict(self.best_k_models),
            "kth_best_model_path": self.kth_best_model_path, "kth_value": self.kth_value,
            "last_model_path": self.last_model_path, "last_global_step_saved": self._last_global_step_saved,
        }

    def load_state_dict(self, state: dict) -> None:
        """Carry on the bookkeeping of the run being resumed where its files are, else restore
        only ``best_model_path`` and say so (``framework/callbacks/checkpoint_resume.py``)."""
        self.best_model_path = state.get("best_model_path", "")
        self._last_global_step_saved = state.get("last_global_step_saved", 0)
        why = why_not_continued(state, monitor=self.monitor, mode=self.mode, dirpath=self.dirpath,
                                dirpath_given=self._dirpath_given, experiment_dir=self._experiment_dir)
        if why is not None:
            rank_zero_warn(not_restored_warning(state, why, self.dirpath))
            return
        vars(self).update(restored_bookkeeping(state))


def _expand_user(path: str) -> str:
    """A local ``dirpath``'s ``~`` as the user's home (Lightning's ``os.path.expanduser``); a URL as it is."""
    return path if paths.is_url(path) else os.path.expanduser(path)
