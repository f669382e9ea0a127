"""TensorBoard logger: scalars and hyperparameters as TensorBoard event files.

``torch.utils.tensorboard`` (and with it ``tensorboard``) is imported on the first write, not
when this module is imported, so that ``import framework`` stays light.

A folder that cannot be written mid-fit (a full disk, the folder gone) does not stop training.
``SummaryWriter`` writes in a thread that dies at the first ``OSError`` and raises it at the next
call; the logger then drops that writer, and the metrics logged since the last flush that worked
wait (up to 10,000 ``log_metrics`` calls) and go to a new event file in the same folder at the
next ``save`` that works: one warning when it starts, and at the end one warning counts the calls
never written. (Lightning's TensorBoardLogger ends the fit with the ``OSError``.)

A URL ``save_dir`` (``s3://bucket/run``): the event files are written in the logger's local copy
of its folder and uploaded (``Logger.publish``: every 10 s at most, and at ``finalize``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from framework import paths
from framework.errors import ConfigError
from framework.loggers.base import Logger, flatten, to_float, to_plain
from framework.loggers.failed_writes import FailedWrites

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter


class TensorBoardLogger(Logger):
    """Write metrics to ``<save_dir>/<name>/version_<N>/events.out.tfevents.*``.

    Hyperparameters go to TensorBoard's HPARAMS tab (nested keys flattened to ``"a/b"``) and to
    ``hparams.yaml`` in the same folder (``hparams-1.yaml``, ... where an earlier command's is there).

    Args:
        save_dir: Root folder; ``None`` lets the Trainer use its ``default_root_dir``.
        name: Experiment name (a sub-folder of ``save_dir``).
        version: ``None`` for the next free ``version_<N>``, an int, or a folder name.
        log_graph: Lightning's; ``True`` is refused (fw does not trace the model into TensorBoard).
        default_hp_metric: Also log a placeholder ``hp_metric = -1`` with the hyperparameters,
            which TensorBoard's HPARAMS tab needs to show a run.
        prefix: Put in front of every metric name, joined with ``"-"``, as Lightning's.
        sub_dir: A folder inside the version folder to write into (``~`` and variables expanded).
        kwargs: For ``SummaryWriter`` (``flush_secs`` is 10 unless given).

    The arguments are Lightning's, in its order.
    """

    def __init__(self, save_dir: str | os.PathLike | None = None, name: str | None = "fw_logs",
                 version: int | str | None = None, log_graph: bool = False, default_hp_metric: bool = True,
                 prefix: str = "", sub_dir: str | os.PathLike | None = None, **kwargs: Any) -> None:
        if log_graph:
            raise ConfigError("TensorBoardLogger(log_graph=True) is not supported by fw: it does not trace the model "
                              "into TensorBoard; leave log_graph out (self.logger.experiment.add_graph(...) does it)")
        super().__init__(save_dir, name, version)
        self.default_hp_metric, self._prefix = default_hp_metric, prefix
        self._sub_dir = os.path.expandvars(os.path.expanduser(os.fspath(sub_dir))) if sub_dir is not None else None
        self._writer_options = {"flush_secs": 10, **kwargs}
        self.hparams: dict[str, Any] = {}
        self._experiment: SummaryWriter | None = None
        self._waiting: list[tuple[int, dict[str, float]]] = []  # logged since the last flush that worked
        self._sent = 0  # how many of them the writer has been given
        self._failed = FailedWrites("TensorBoardLogger")
        self._hp_metrics: dict[str, float] | None = None  # of the last log_hyperparams, for its summary
        self._hparams_sent = self._yaml_unsaved = False

    @property
    def sub_dir(self) -> str | None:
        return self._sub_dir

    @property
    def log_dir(self) -> str:
        """The version folder, and ``sub_dir`` inside it when given (Lightning's)."""
        return paths.join(self.version_dir, self._sub_dir) if self._sub_dir else self.version_dir

    @property
    def experiment(self) -> SummaryWriter:
        """The ``SummaryWriter``, created (with the log folder and a new event file) on first use,
        and again after a write failed."""
        if self._experiment is None:
            from torch.utils.tensorboard import SummaryWriter

            folder = self.local_dir
            before = set(os.listdir(folder)) if os.path.isdir(folder) else set()
            _QUIET.add(folder)
            try:
                os.makedirs(folder, exist_ok=True)
                self._experiment = SummaryWriter(log_dir=folder, **self._writer_options)
            except OSError:  # its first event could not be written: remove the file it began
                for name in set(os.listdir(folder)) - before if os.path.isdir(folder) else ():
                    _remove(os.path.join(folder, name))
                raise
            self._sent = 0
        return self._experiment

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        if len(self._waiting) >= self._failed.keep:
            self._push()  # so many calls without a save; when the folder cannot be written, the call is dropped
            if len(self._waiting) >= self._failed.keep:
                self._failed.dropped += 1
                return
        self._waiting.append((step, {self._prefixed(key): to_float(value) for key, value in metrics.items()}))
        if self._experiment is not None or not self._failed.failing:  # after a failure, only save() tries again
            try:
                self._send()
            except OSError as err:
                self._writer_failed(err)

    def log_hyperparams(self, params: Mapping[str, Any] | argparse.Namespace,
                        metrics: Mapping[str, float] | None = None) -> None:
        """Record hyperparameters; repeated calls merge into one set.

        Args:
            params: Hyperparameters; nested mappings become ``"a/b"`` keys in TensorBoard.
            metrics: Optional metrics to show next to them in the HPARAMS tab.
        """
        self.hparams.update(to_plain(params))
        self._save_hparams_yaml()
        metrics = dict(metrics or {})
        if self.default_hp_metric and not metrics:  # Lightning's placeholder, at each call's hyperparameters
            metrics = {"hp_metric": -1.0}
        if metrics:
            self.log_metrics(metrics, step=0)
        self._hp_metrics = {k: to_float(v) for k, v in metrics.items()}
        if self._experiment is not None or not self._failed.failing:
            try:
                self._send()
            except OSError as err:
                self._writer_failed(err)

    def save(self) -> None:
        """Flush the writer; when the folder cannot be written, what was logged waits for the next call."""
        if self._experiment is not None or self._waiting:
            self._push()
        if os.path.isdir(self.local_dir) and (self._yaml_unsaved or not self.hparams_file.holds(self.local_dir)):
            self._save_hparams_yaml()  # Lightning's: also without any
        self.publish_for_now()

    def finalize(self, status: str) -> None:
        if self._experiment is not None or self._waiting:
            self._push()
        if self._experiment is not None:
            try:
                self._experiment.close()
            except OSError as err:
                self._writer_failed(err)
            # A later write (e.g. trainer.test after fit) opens a new event file in the same folder.
            self._experiment = None
            _QUIET.remove(self.local_dir)  # its writer thread has ended
        self.publish_last()
        self._failed.report(self.log_dir, len(self._waiting), "log_metrics calls")
        self._waiting = []

    def _save_hparams_yaml(self) -> None:
        path = self.hparams_file.path or os.path.join(self.local_dir, "hparams.yaml")
        try:
            self.hparams_file.write(self.local_dir, self.hparams)
        except OSError as err:
            self._yaml_unsaved = True
            self._failed.failed(path, err, len(self._waiting), "log_metrics calls")
        else:
            self._yaml_unsaved = False

    def _send(self) -> None:
        """Give the writer (a new one, after a failure) what it has not been given yet: the
        scalars, then the hyperparameters' summary (TensorBoard's HPARAMS tab)."""
        writer = self.experiment
        for step, values in self._waiting[self._sent:]:
            for key, value in values.items():
                writer.add_scalar(key, value, global_step=step)
            self._sent += 1
        if self._hp_metrics is not None and not self._hparams_sent:
            from torch.utils.tensorboard.summary import hparams

            # TensorBoard's hparams plugin takes only numbers, strings, bools (and tensors).
            flat = {k: (v if isinstance(v, (bool, int, float, str)) else str(v))
                    for k, v in flatten(self.hparams).items()}
            # Written into this run's own event file; SummaryWriter.add_hparams would start a new
            # sub-run folder instead.
            for summary in hparams(flat, self._hp_metrics):
                writer._get_file_writer().add_summary(summary)
            self._hparams_sent = True

    def _push(self) -> None:
        """Send what waits and flush; when that fails it all waits for the next call."""
        try:
            self._send()
            self.experiment.flush()
        except OSError as err:
            self._writer_failed(err)
            return
        self._failed.worked(self.log_dir, len(self._waiting), "log_metrics calls")
        self._waiting, self._sent = [], 0

    def _writer_failed(self, err: OSError) -> None:
        """Drop the writer, whose thread has died (its event file stays, with what it wrote)."""
        if self._experiment is not None:
            with contextlib.suppress(OSError):
                self._experiment.close()
            self._experiment = None
        self._hparams_sent = False  # the new event file gets them too
        self._failed.failed(self.log_dir, err, len(self._waiting), "log_metrics calls")


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.remove(path)


class _QuietWriterThreads:
    """``threading.excepthook`` that does not print the ``OSError`` which ends a TensorBoard
    writer thread writing into one of the loggers' folders as a traceback (the writer raises it
    again at its next call, and the logger warns once); everything else goes to the hook that
    was there before. (The thread is told by the file it writes: it can fail while its writer is
    being made, before the logger has the writer.)"""

    def __init__(self) -> None:
        self.folders: set[str] = set()
        self.previous: Any = threading.__excepthook__
        self.calling = threading.local()

    def add(self, folder: str) -> None:
        self.folders.add(os.path.abspath(folder))
        if threading.excepthook is not self:  # again if another hook was put there since (pytest does, per test)
            self.previous, threading.excepthook = threading.excepthook, self

    def remove(self, folder: str) -> None:
        """``folder``'s logger was finalized: with no folder left, the hook that was there is back."""
        self.folders.discard(os.path.abspath(folder))
        if not self.folders and threading.excepthook is self:
            threading.excepthook = self.previous

    def __call__(self, args: threading.ExceptHookArgs) -> None:
        writer = getattr(getattr(args.thread, "_record_writer", None), "_writer", None)
        path = getattr(writer, "filename", None) or getattr(writer, "name", None)  # tensorboard's stub GFile, tf's
        ours = isinstance(path, (str, bytes)) and os.path.dirname(os.path.abspath(os.fsdecode(path))) in self.folders
        if ours and args.exc_type is not None and issubclass(args.exc_type, OSError):
            return
        if getattr(self.calling, "now", False):  # a hook that calls the one it replaced, which was this one
            threading.__excepthook__(args)
            return
        self.calling.now = True
        try:
            self.previous(args)
        finally:
            self.calling.now = False


_QUIET = _QuietWriterThreads()
