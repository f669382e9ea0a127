"""The launcher's report of failed workers (``framework/strategies/worker_failures.py``): a user's
mistake raised alike on every rank is one line, once, with no traceback; a mistake beside other
failures is named with its rank; an error in user code keeps its traceback."""

from __future__ import annotations

import pytest
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from framework.errors import ConfigError
from framework.strategies.worker_failures import record_worker_error, report_failures


def _failed(tmp_path, monkeypatch, rank: int, exc: BaseException, exitcode: int) -> ProcessFailure:
    """The failure the agent hands the launcher, read from the file the worker wrote."""
    path = tmp_path / f"error-{rank}.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    try:
        raise exc
    except BaseException as raised:  # with a traceback, as in a worker
        record_worker_error(raised)
    return ProcessFailure(local_rank=rank, pid=1000 + rank, exitcode=exitcode, error_file=str(path))


REFUSAL = "trainer.precision=16-mixed with strategy fsdp: not supported; use trainer.precision=bf16-mixed"


def test_the_same_refusal_on_every_rank_is_one_line(tmp_path, monkeypatch, capsys):
    failures = {rank: _failed(tmp_path, monkeypatch, rank, ConfigError(REFUSAL), 2) for rank in (0, 1)}
    assert report_failures(failures) == 2
    assert capsys.readouterr().err == f"fw: error: {REFUSAL}\n"


def test_a_refusal_beside_another_failure_names_the_ranks_without_a_traceback(tmp_path, monkeypatch, capsys):
    failures = {1: _failed(tmp_path, monkeypatch, 1, ConfigError(REFUSAL), 2),
                0: _failed(tmp_path, monkeypatch, 0, RuntimeError("Connection closed by peer"), 1)}
    assert report_failures(failures) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [f"fw: error: worker rank 1: {REFUSAL}",
                                "fw: worker rank 0 (pid 1000) also failed: RuntimeError: Connection closed by peer"]


@pytest.mark.parametrize("second", [ValueError("bad value"), ConfigError("another refusal")])
def test_an_error_in_user_code_keeps_its_traceback(tmp_path, monkeypatch, capsys, second):
    failures = {0: _failed(tmp_path, monkeypatch, 0, ValueError("bad value"), 1),
                1: _failed(tmp_path, monkeypatch, 1, second, 1)}
    assert report_failures(failures) == 1
    err = capsys.readouterr().err
    assert err.startswith("fw: error: worker rank 0 (pid 1000) failed with exit code 1: ValueError: bad value")
    assert err.count("Traceback (most recent call last)") == 1


def test_a_refusal_exits_with_the_code_of_a_worker_that_exited_not_of_one_stopped(tmp_path, monkeypatch, capsys):
    """Rank 0 recorded the refusal first, then the agent's SIGTERM stopped it before it exited."""
    failures = {0: _failed(tmp_path, monkeypatch, 0, ConfigError(REFUSAL), -15),
                1: _failed(tmp_path, monkeypatch, 1, ConfigError(REFUSAL), 2)}
    assert report_failures(failures) == 2
    assert capsys.readouterr().err == f"fw: error: {REFUSAL}\n"
