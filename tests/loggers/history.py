"""What a Trainer sent its loggers, as a CSVLogger beside the logger under test wrote it down, and
a comparison of two such histories (metric -> [(step, value), ...])."""

from __future__ import annotations

import csv

import pytest

from framework.loggers import CSVLogger

History = dict[str, list[tuple[int, float]]]


def recorder() -> CSVLogger:
    """The second logger of a Trainer: the same calls as the first, written where a test can read them."""
    return CSVLogger(save_dir="sent", flush_logs_every_n_steps=1)


def sent(trainer) -> History:
    """Every ``log_metrics`` call the Trainer made, from the recorder (its second logger)."""
    with open(trainer.loggers[1].metrics_file_path, newline="") as f:
        rows = list(csv.DictReader(f))
    history: History = {}
    for row in rows:
        for key, value in row.items():
            if key != "step" and value != "":
                history.setdefault(key, []).append((int(row["step"]), float(value)))
    return history


def distinct(history: History) -> History:
    """Each metric's distinct (step, value) rows: MLflow's store keeps one row of a key, step, value
    and millisecond time, so two log calls in one millisecond that repeat a value at a step (the
    "epoch" every call adds) are one row on the server, with Lightning's logger as with fw's."""
    return {key: sorted(set(rows)) for key, rows in history.items()}


def assert_same(history: History, expected: History, rel: float = 1e-6) -> None:
    """The same metric names, each at the same steps (as often), with the same values."""
    ordered = {key: sorted(rows) for key, rows in history.items()}
    wanted = {key: sorted(rows) for key, rows in expected.items()}
    steps = {k: [s for s, _ in v] for k, v in ordered.items()}
    wanted_steps = {k: [s for s, _ in v] for k, v in wanted.items()}
    assert steps == wanted_steps, f"steps on the server {steps}, sent {wanted_steps}"
    for key, rows in ordered.items():
        assert [v for _, v in rows] == pytest.approx([v for _, v in wanted[key]], rel=rel), key
