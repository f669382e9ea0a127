"""``Profiler``: the base of fw's profilers, Lightning's ``Profiler`` under the same names.

A profiler records *actions*: ``start(name)`` / ``stop(name)`` around each (``profile(name)`` is
the context manager of the two). The Trainer times every hook it calls under Lightning's action
names (``[LightningModule]Model.on_train_batch_start``, ``[Callback]EarlyStopping.on_validation_end``,
``[Strategy]SingleDeviceStrategy.training_step``, ``run_training_epoch``, ...: see
``framework/profilers/timing.py``) and, at the end of each fit/validate/test/predict, calls
``describe()``: ``summary()`` goes to stderr through ``logging`` (on local rank 0), or, with a
``filename``, to ``dirpath/{stage}-{filename}[-{local_rank}].txt`` (every rank its own file;
``dirpath`` defaults to the run folder, ``trainer.log_dir``). A subclass implements ``start``,
``stop`` and ``summary``.
"""

from __future__ import annotations

import os
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from framework.errors import ConfigError
from framework.paths import is_url, local_path


class Profiler(ABC):
    """Records how long actions take. Subclass it for a profiler of your own.

    Args:
        dirpath: the folder for ``filename`` (None: the run folder, ``trainer.log_dir``).
        filename: write the report to ``{stage}-{filename}.txt`` there (``-{local_rank}`` added
            when the job has several processes) instead of logging it; appended to, not replaced.
    """

    def __init__(self, dirpath: str | Path | None = None, filename: str | None = None) -> None:
        self.dirpath = local_path(dirpath, f"{type(self).__name__} dirpath") if dirpath is not None else None
        self.filename = filename
        self._output_file: IO[str] | None = None
        self._write_stream: Callable[[str], Any] | None = None
        self._local_rank: int | None = None
        self._stage: str | None = None
        #: the module of the run being profiled (set by the Trainer; Lightning's name)
        self._lightning_module: Any = None

    @abstractmethod
    def start(self, action_name: str) -> None:
        """Start recording ``action_name``."""

    @abstractmethod
    def stop(self, action_name: str) -> None:
        """Stop recording ``action_name`` (started before)."""

    def summary(self) -> str:
        """The report of what was recorded ("" for none)."""
        return ""

    @contextmanager
    def profile(self, action_name: str) -> Iterator[str]:
        """``with profiler.profile("load data"): ...`` records that block as one action."""
        try:
            self.start(action_name)
            yield action_name
        finally:
            self.stop(action_name)

    # -- the run's side: set up, report, tear down ------------------------------------------------
    def setup(self, stage: str, local_rank: int | None = None, log_dir: str | None = None) -> None:
        """Before a run: its stage (``fit``, ``validate``, ...), this process's local rank (None
        in a one-process job) and the run folder, which ``dirpath`` defaults to."""
        self._stage = stage
        self._local_rank = local_rank
        if not self.dirpath and log_dir is not None and is_url(log_dir):  # the run folder is in object storage
            if self._writes_files():
                name = type(self).__name__
                error = ConfigError(f"{name} dirpath is not set and the run folder '{log_dir}' is object storage, "
                                    f"where the profiler writes no files; give a local folder: {name}(dirpath="
                                    "'profiler', ...)")
                error.alike_on_every_rank = True  # the arguments alone: rank 0 says it
                raise error
            return  # the report goes to the log
        self.dirpath = self.dirpath or log_dir

    def _writes_files(self) -> bool:
        """Does this profiler write files into ``dirpath`` (its report, with a ``filename``)?"""
        return bool(self.filename)

    def describe(self) -> None:
        """Write the report (a file, or the log on local rank 0), then ``teardown``."""
        self._prepare_streams()
        summary = self.summary()
        if summary and self._write_stream is not None:
            self._write_stream(summary)
        if self._output_file is not None:
            self._output_file.flush()
        self.teardown(stage=self._stage)

    def teardown(self, stage: str | None) -> None:
        """After a run: close the report's file."""
        self._write_stream = None
        if self._output_file is not None:
            self._output_file.close()
            self._output_file = None

    @property
    def local_rank(self) -> int:
        return 0 if self._local_rank is None else self._local_rank

    # -- helpers for subclasses -----------------------------------------------------------------
    def _rank_zero_info(self, message: str) -> None:
        if self._local_rank in (None, 0):
            from framework.rank_zero import library_logger

            library_logger().info(message)

    def _prepare_filename(self, action_name: str | None = None, extension: str = ".txt") -> str:
        """``{stage}-{filename}-{local_rank}-{action}{extension}``, each part only when known,
        with the characters no file name may hold replaced by ``_`` (Lightning's names)."""
        parts = [self._stage, self.filename, None if self._local_rank is None else str(self._local_rank),
                 action_name]
        base = "-".join(part for part in parts if part)
        base = re.sub(r"_+", "_", re.sub(r"[\\/:*?\"<>|\n\r\t]", "_", base)).strip()
        return (base or "profile") + extension

    def _prepare_streams(self) -> None:
        if self._write_stream is not None:
            return
        if self.filename and self.dirpath:
            os.makedirs(self.dirpath, exist_ok=True)
            self._output_file = open(os.path.join(self.dirpath, self._prepare_filename()), "a")  # noqa: SIM115
            self._write_stream = self._output_file.write
        else:
            self._write_stream = self._rank_zero_info

    def _stats_to_str(self, stats: dict[str, str]) -> str:
        """A report of one text per action (the advanced and PyTorch profilers' layout)."""
        stage = f"{self._stage.upper()} " if self._stage is not None else ""
        output = [stage + "Profiler Report"]
        for action, value in stats.items():
            rank = f" rank: {self._local_rank}" if self._local_rank is not None else ""
            output += [f"Profile stats for: {action}{rank}", value]
        return os.linesep.join(output)

    def __getstate__(self) -> dict[str, Any]:
        # a Trainer sent to spawned workers carries its profiler: not an open file or a module
        state = dict(self.__dict__)
        state.update(_output_file=None, _write_stream=None, _lightning_module=None)
        return state

    def __del__(self) -> None:
        if "_stage" in self.__dict__:  # not for one whose __init__ failed
            self.teardown(stage=self._stage)
