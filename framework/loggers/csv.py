"""CSV logger: one ``metrics.csv`` per run, readable by any spreadsheet or by pandas.

Each ``log_metrics`` call is one row (``step`` first, then the metrics logged at that call);
columns are the union of every key seen so far. When a new key appears the file is rewritten
with the wider header, so the file is always a valid, rectangular CSV.

A folder that cannot be written mid-fit (a full disk, the folder gone) does not stop training:
the rows wait (up to 10,000; later ones are dropped) and are written at the next ``save`` that
works (a write that fails part-way is cut back, so no row is torn or written twice); one warning
when it starts, and at the end one warning counts the rows never written.
(Lightning's CSVLogger ends the fit with the ``OSError``.)

A URL ``save_dir`` (``s3://bucket/run``): the file is written in the logger's local copy of its
folder and uploaded whole (``Logger.publish``: every 10 s at most, and at ``finalize``).
"""

from __future__ import annotations

import argparse
import csv
import os
from collections.abc import Mapping
from typing import Any

from framework import paths
from framework.loggers.base import Logger, to_float, to_plain
from framework.loggers.failed_writes import FailedWrites


class CSVLogger(Logger):
    """Write metrics to ``<save_dir>/<name>/version_<N>/metrics.csv`` and ``hparams.yaml``.

    Args:
        save_dir: Root folder; ``None`` lets the Trainer use its ``default_root_dir``.
        name: Experiment name (a sub-folder of ``save_dir``).
        version: ``None`` for the next free ``version_<N>``, an int, or a folder name. An
            existing ``metrics.csv`` in that folder is appended to (resume).
        prefix: Put in front of every metric name, joined with ``"-"`` (``step`` stays ``step``), as Lightning's.
        flush_logs_every_n_steps: Rows are buffered and written every this many
            ``log_metrics`` calls, and on ``save``/``finalize``.
    """

    METRICS_FILE = "metrics.csv"
    STEP_KEY = "step"

    def __init__(self, save_dir: str | os.PathLike | None = None, name: str | None = "fw_logs",
                 version: int | str | None = None, prefix: str = "", flush_logs_every_n_steps: int = 100) -> None:
        super().__init__(save_dir, name, version)
        if flush_logs_every_n_steps < 1:
            from framework.errors import ConfigError

            raise ConfigError(f"CSVLogger(flush_logs_every_n_steps={flush_logs_every_n_steps}) must be >= 1")
        self.flush_logs_every_n_steps, self._prefix = flush_logs_every_n_steps, prefix
        self.hparams: dict[str, Any] = {}
        self._rows: list[dict[str, float | int]] = []
        self._columns: list[str] | None = None  # header of the file on disk; None until read
        self._failed = FailedWrites("CSVLogger")

    @property
    def metrics_file_path(self) -> str:
        return paths.join(self.log_dir, self.METRICS_FILE)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        row: dict[str, Any] = {self.STEP_KEY: int(step)}
        row.update({self._prefixed(key): _cell(value) for key, value in metrics.items() if key != self.STEP_KEY})
        if len(self._rows) >= self._failed.keep:  # the folder has not been writable for that long
            self._failed.dropped += 1
            return
        self._rows.append(row)
        if len(self._rows) >= self.flush_logs_every_n_steps:
            self.save()

    def log_hyperparams(self, params: Mapping[str, Any] | argparse.Namespace) -> None:
        """Record hyperparameters in ``hparams.yaml`` (``hparams-1.yaml``, ... where an earlier
        command's is there); repeated calls merge into one set."""
        self.hparams.update(to_plain(params))
        self.hparams_file.write(self.local_dir, self.hparams)
        self.publish_for_now()

    def save(self) -> None:
        """Write the rows that wait; when the folder cannot be written, they wait for the next call."""
        if not self._rows:
            return
        try:
            self._write(os.path.join(self.local_dir, self.METRICS_FILE))
        except OSError as err:
            self._failed.failed(self.metrics_file_path, err, len(self._rows), "rows")
            return
        self._failed.worked(self.metrics_file_path, len(self._rows), "rows")
        self._rows = []  # written: an upload that fails sends the file again later, the rows are not written again
        self.publish_for_now()

    def finalize(self, status: str) -> None:
        self.save()
        self.publish_last()
        self._failed.report(self.metrics_file_path, len(self._rows), "rows")
        self._rows = []

    def _write(self, path: str) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        columns = self._columns if self._columns is not None else self._read_header(path)
        new_keys = [k for row in self._rows for k in row if k not in columns]
        new_keys = list(dict.fromkeys(new_keys))  # dedupe, keep first-seen order
        if new_keys and os.path.exists(path):
            self._rewrite(path, columns + new_keys)
            return
        fresh = not os.path.exists(path)
        size = 0 if fresh else os.path.getsize(path)
        try:
            with open(path, "a", newline="", encoding="utf-8") as f:
                writer = csv.DictWriter(f, fieldnames=columns + new_keys, restval="")
                if fresh:
                    writer.writeheader()
                writer.writerows(self._rows)
        except OSError:  # a write that failed part-way (a full disk): no torn row, the rows wait whole
            _cut_back(path, size, fresh)
            raise
        self._columns = columns + new_keys  # the header on disk, once it is there

    def _read_header(self, path: str) -> list[str]:
        if not os.path.exists(path):
            return [self.STEP_KEY]
        with open(path, newline="", encoding="utf-8") as f:
            header = next(csv.reader(f), None)
        return list(header) if header else [self.STEP_KEY]

    def _rewrite(self, path: str, columns: list[str]) -> None:
        """Rewrite the whole file with a wider header: old rows, then the buffered ones."""
        with open(path, newline="", encoding="utf-8") as f:
            old_rows = list(csv.DictReader(f))
        tmp = path + ".tmp"
        try:
            with open(tmp, "w", newline="", encoding="utf-8") as f:
                writer = csv.DictWriter(f, fieldnames=columns, restval="")
                writer.writeheader()
                writer.writerows(old_rows)
                writer.writerows(self._rows)
            os.replace(tmp, path)
        except OSError:
            _cut_back(tmp, 0, fresh=True)
            raise
        self._columns = columns


def _cut_back(path: str, size: int, fresh: bool) -> None:
    """Undo a failed append: the file as it was (``size`` bytes), or gone if it was not there."""
    try:
        if fresh:
            os.remove(path)
        else:
            os.truncate(path, size)
    except OSError:
        pass  # the folder itself is gone: nothing torn is left to read


def _cell(value: Any) -> float | int:
    """A value as Lightning's CSV logger writes it: an int stays one (``epoch``: 0, not 0.0)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else to_float(value)
