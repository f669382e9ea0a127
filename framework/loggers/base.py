"""The logger base: where a run's metrics and hyperparameters go.

A logger needs little: ``log_metrics(metrics, step)``, ``log_hyperparams(params)``, ``save()``
and ``finalize(status)``. The Trainer calls loggers on global rank 0 only, so a logger never
takes part in a collective.

Each run gets its own folder, ``<save_dir>/<name>/version_<N>``, where ``N`` is the next free
integer. The version is resolved once, lazily, on the first access of ``version`` or
``log_dir``, and nothing is created on disk until the first write.

``save_dir`` may be a URL (``s3://bucket/run``, ``paths.py``). A logger then writes its files
(event files, ``metrics.csv``, ``hparams.yaml``) into ``local_dir``, a local copy of its
``log_dir`` that starts with the files already there (a resumed run appends to them), and
``publish`` uploads what changed: at most every ``PUBLISH_EVERY`` seconds during a run (an
upload per logged row would cost a request each), and at ``finalize``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from framework import paths
from framework.paths import new_record
from framework.rank_zero import rank_zero_warn


class Logger(ABC):
    """Base class for loggers.

    Args:
        save_dir: Root folder for the logs. ``None`` lets the Trainer set it to its
            ``default_root_dir`` through ``set_default_root``.
        name: Experiment name: a sub-folder of ``save_dir``. Empty puts versions directly in
            ``save_dir``.
        version: ``None`` takes the next free ``version_<N>``; an int ``N`` uses
            ``version_<N>``; a string is used as the folder name as it is.
    """

    LOGGER_JOIN_CHAR = "-"
    #: seconds between two uploads of a URL log folder's files during a run (``publish``)
    PUBLISH_EVERY = 10.0
    _prefix = ""  # put in front of every metric name (the ``prefix=`` of the loggers that take one)

    def __init__(self, save_dir: str | os.PathLike | None = None, name: str | None = "fw_logs",
                 version: int | str | None = None) -> None:
        self._save_dir = paths.storage_path(save_dir, f"{type(self).__name__} save_dir") if save_dir is not None else None
        self._name = name or ""
        self._version = version
        self._picked = False  # the version was the next free one (set_default_root)

    def _prefixed(self, key: str) -> str:
        """``key`` with this logger's prefix in front, joined by ``LOGGER_JOIN_CHAR``, as Lightning's."""
        return f"{self._prefix}{self.LOGGER_JOIN_CHAR}{key}" if self._prefix else key

    # -- where ----------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self._name

    @property
    def save_dir(self) -> str:
        """The root folder; the working directory if neither the user nor the Trainer set one."""
        return self._save_dir if self._save_dir is not None else os.getcwd()

    @property
    def version(self) -> int | str:
        if self._version is None:
            self._version = self._next_version()
        return self._version

    @property
    def root_dir(self) -> str:
        """``<save_dir>/<name>``: the folder that holds the versions."""
        return paths.join(self.save_dir, self.name) if self.name else self.save_dir

    @property
    def log_dir(self) -> str:
        """``<save_dir>/<name>/version_<N>`` (or the version string itself as the last part)."""
        return self.version_dir

    @property
    def version_dir(self) -> str:
        """This run's version folder, which holds ``checkpoints/`` (``log_dir`` may lie inside it)."""
        version = self.version
        folder = version if isinstance(version, str) else f"version_{version}"
        return paths.join(self.root_dir, folder)

    @property
    def local_dir(self) -> str:
        """The folder this logger writes into with the OS: ``log_dir``, or for a URL ``log_dir``
        a local copy of it (made on first use with the files already there) that ``publish`` uploads."""
        log_dir = self.log_dir
        if not paths.is_url(log_dir):
            return log_dir
        staged = vars(self).get("_staged")
        if staged is None or staged[0] != log_dir:
            local = tempfile.mkdtemp(prefix="fw-logs-")
            for name in paths.listdir(log_dir):  # the files, not the folders (checkpoints/)
                remote = paths.join(log_dir, name)
                if paths.isfile(remote):
                    with open(os.path.join(local, name), "wb") as f:
                        f.write(paths.read_bytes(remote))
            staged = self._staged = (log_dir, local, _stamps(local))
            self._published = time.monotonic()
        return staged[1]

    def publish(self, force: bool = True) -> None:
        """Upload the files of ``local_dir`` that changed to a URL ``log_dir`` (nothing for a
        local one); without ``force``, only when ``PUBLISH_EVERY`` seconds have passed."""
        staged = vars(self).get("_staged")
        if staged is None or (not force and time.monotonic() - self._published < self.PUBLISH_EVERY):
            return
        log_dir, local, sent = staged
        now = _stamps(local)
        for name, stamp in now.items():
            if sent.get(name) != stamp:
                fs, path = paths.filesystem(paths.join(log_dir, name), settle=False)  # not after checkpoints
                fs.put_file(os.path.join(local, name), path)
                sent[name] = stamp
        self._published = time.monotonic()

    def publish_for_now(self) -> None:
        """``publish(force=False)`` during a run: an upload that fails is tried again at the next
        call (its files stay marked as changed), with one warning until one works again."""
        try:
            self.publish(force=False)
        except Exception as err:  # OSError, or a back end's own (an expired token, a throttled request)
            if not vars(self).get("_upload_failing"):
                self._upload_failing = True
                log_dir, local, _ = self._staged
                rank_zero_warn(f"{type(self).__name__}: uploading the logs to '{log_dir}' failed ({type(err).__name__}: "
                               f"{_first_line(err)}); training goes on, they are in '{local}' and are uploaded again "
                               "at the next try and at the end")
        else:
            self._upload_failing = False

    def publish_last(self) -> None:
        """The last ``publish`` (at ``finalize``); the local copy of a URL log folder is removed
        once all of it is in the URL, never before: where the upload fails, it stays where it
        is, named in one warning with the URL to copy it to."""
        staged = vars(self).get("_staged")
        if staged is None:
            return
        try:
            self.publish()
        except Exception as err:  # OSError, or a back end's own (an expired token, a throttled request)
            del self._staged  # kept on disk, never staged again: a later stage starts from the URL
            rank_zero_warn(f"{type(self).__name__}: uploading the logs to '{staged[0]}' failed ({type(err).__name__}: "
                           f"{_first_line(err)}); they are kept in '{staged[1]}': copy that folder to '{staged[0]}' "
                           "(e.g. fsspec's put(..., recursive=True) or 'aws s3 cp --recursive')")
            return
        self._upload_failing = False
        shutil.rmtree(staged[1], ignore_errors=True)
        del self._staged

    def set_default_root(self, root_dir: str | os.PathLike, resume_from: str | None = None) -> None:
        """Set ``save_dir`` when the user gave none. Called by the Trainer before any logging.

        ``resume_from``: the checkpoint a resumed run starts from; when it lies in one of this
        logger's version folders (and no version was given), the run goes on logging there.
        """
        if self._save_dir is None:
            self._save_dir = os.fspath(root_dir)
        if self._version is None and resume_from:
            self._version = self._version_holding(resume_from)
        self._picked = self._version is None
        # Resolve the version now, before any logger writes: several loggers sharing a name then
        # share a version folder instead of the second one seeing the first's and moving on.
        _ = self.version

    def keep_apart_from(self, others: Sequence[Logger]) -> None:
        """A version this logger picked itself moves past one that another logger of its kind
        writes to already: two CSVLoggers of one folder write ``version_0`` and ``version_1``, as
        in Lightning (the same files in one folder would mix)."""
        while getattr(self, "_picked", False) and isinstance(self.version, int) and any(
                type(other) is type(self) and other.log_dir == self.log_dir for other in others):
            before = self.log_dir
            self._version = self.version + 1
            if self.log_dir == before:  # a logger whose folder is not its version's: nothing to move
                return

    def _version_holding(self, path: str) -> int | None:
        if paths.is_url(path) or paths.is_url(self.root_dir):
            head = self.root_dir.rstrip("/") + "/"
            relative_url = path[len(head):] if path.startswith(head) else ""
            match = re.fullmatch(r"version_(\d+)", relative_url.split("/")[0])
            return int(match.group(1)) if match else None
        relative = os.path.relpath(os.path.realpath(path), os.path.realpath(self.root_dir))
        match = re.fullmatch(r"version_(\d+)", relative.split(os.sep)[0])
        return int(match.group(1)) if match and not relative.startswith("..") else None

    def set_version(self, version: int | str) -> None:
        """Pin the version, e.g. to the one rank 0 resolved, so that every rank agrees."""
        self._version = version

    def _next_version(self) -> int:
        root = self.root_dir
        if paths.is_url(root):  # one listing: names of version_<N> prefixes are folders
            found = [int(m.group(1)) for entry in paths.listdir(root) if (m := re.fullmatch(r"version_(\d+)", entry))]
            return max(found) + 1 if found else 0
        if not os.path.isdir(root):
            return 0
        found = [int(m.group(1)) for entry in os.listdir(root)
                 if (m := re.fullmatch(r"version_(\d+)", entry)) and os.path.isdir(os.path.join(root, entry))]
        return max(found) + 1 if found else 0

    # -- what -----------------------------------------------------------------------------
    @abstractmethod
    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Record scalar ``metrics`` at ``step``."""

    @abstractmethod
    def log_hyperparams(self, params: Mapping[str, Any] | argparse.Namespace) -> None:
        """Record the run's hyperparameters (nested mappings are allowed)."""

    def save(self) -> None:
        """Push buffered records to disk."""

    def finalize(self, status: str) -> None:
        """Called once at the end of a run with ``"success"``, ``"failed"`` or ``"interrupted"``."""
        self.save()

    @property
    def hparams_file(self) -> HparamsFile:
        """Where this command writes its ``hparams.yaml`` (shared by the loggers of one Trainer
        that write into one folder; see ``HparamsFile``)."""
        if "_hparams_file" not in vars(self):
            self._hparams_file = HparamsFile()
        return self._hparams_file

    @hparams_file.setter
    def hparams_file(self, claim: HparamsFile) -> None:
        self._hparams_file = claim

    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        """Called on rank 0 after ``ModelCheckpoint`` saved a file (Lightning's hook): the
        MLflow and W&B loggers upload checkpoints from it (``log_model``)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(save_dir={self._save_dir!r}, name={self._name!r}, version={self._version!r})"


# -- helpers shared by the loggers ----------------------------------------------------------
def _stamps(folder: str) -> dict[str, tuple[int, int]]:
    """Each file of ``folder`` (its sub-folders' too, by relative name) with its size and mtime."""
    found = {}
    for where, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(where, name)
            with contextlib.suppress(OSError):
                stat = os.stat(path)
                found[os.path.relpath(path, folder).replace(os.sep, "/")] = (stat.st_size, stat.st_mtime_ns)
    return found


class NoExperiment:
    """What ``logger.experiment`` is on ranks other than 0 (Lightning's ``DummyExperiment``):
    every call does nothing, so user code that logs through it on every rank writes once."""

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        return None

    def __getattr__(self, name: str) -> NoExperiment:
        return self

    def __getitem__(self, key: Any) -> NoExperiment:
        return self

    def __setitem__(self, key: Any, value: Any) -> None:
        pass


def to_float(value: Any) -> float:
    """A metric value as a Python float; a tensor must hold exactly one element."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"a logged metric must be a scalar, got a tensor of shape {tuple(value.shape)}")
        return float(value.item())
    return float(value)


def to_plain(params: Any) -> Any:
    """Hyperparameters as plain Python (dicts, lists, str, numbers, bools, None).

    Accepts mappings, ``argparse.Namespace`` and OmegaConf containers; anything else that is
    not a primitive becomes its ``str``, so that the result can always be written as YAML.
    """
    if isinstance(params, argparse.Namespace):
        params = vars(params)
    if type(params).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf

        params = OmegaConf.to_container(params, resolve=True)
    if isinstance(params, Mapping):
        return {str(k): to_plain(v) for k, v in params.items()}
    if isinstance(params, (list, tuple)):
        return [to_plain(v) for v in params]
    if isinstance(params, torch.Tensor) and params.numel() == 1:
        return params.item()
    if params is None or isinstance(params, (bool, int, float, str)):
        return params
    return str(params)


def flatten(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a/b": 1}``."""
    flat: dict[str, Any] = {}
    for key, value in params.items():
        full = f"{prefix}/{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            flat.update(flatten(value, full))
        else:
            flat[full] = value
    return flat


class HparamsFile:
    """A command's hyperparameters file in a log folder, never over an earlier command's (as
    ``SaveRecipe`` does for ``config.yaml``): ``hparams.yaml``, or where that is there already (a
    resumed fit goes on in its checkpoint's folder, a pinned version) ``hparams-1.yaml``,
    ``hparams-2.yaml``, ..., made with an exclusive create and said in one line; this command's
    later writes update the file it made."""

    def __init__(self) -> None:
        self.path: str | None = None

    def holds(self, folder: str) -> bool:
        """Whether this command has its file in ``folder``."""
        return self.path is not None and os.path.dirname(self.path) == folder

    def write(self, folder: str, params: Mapping[str, Any]) -> None:
        """Write ``params`` (already plain) as YAML into this command's file in ``folder``."""
        import yaml

        text = yaml.safe_dump(dict(params), sort_keys=False, default_flow_style=False)
        if self.holds(folder):
            assert self.path is not None
            with open(self.path, "w", encoding="utf-8") as f:
                f.write(text)
            return
        self.path = path = new_record(folder, "hparams")  # this command's, also where the write below fails
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        if os.path.basename(path) != "hparams.yaml":
            from framework.rank_zero import rank_zero_info

            rank_zero_info(f"{os.path.join(folder, 'hparams.yaml')} is an earlier command's record and stays as "
                           f"it is; this run's hyperparameters are {os.path.basename(path)}")


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return (text.splitlines()[0] if text else type(err).__name__)[:200]
