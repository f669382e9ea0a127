"""The launcher's report of failed workers (``framework/strategies/launchers/worker_failures.py``): a user's
mistake raised alike on every rank is one line, once, with no traceback; a mistake beside other
failures is named with its rank; an error in user code keeps its traceback."""

from __future__ import annotations

import pytest
from distributed.helpers import REPO
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from framework.errors import ConfigError
from framework.strategies.launchers.worker_failures import record_worker_error, report_failures


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


@pytest.fixture
def torchrun_rank(monkeypatch):
    """This process as rank ``n`` of a job torchrun started (not fw's launcher), without the wait."""
    import framework.strategies.launchers.worker_failures as failures
    from framework.strategies.launchers.processes import LAUNCHER_PID

    monkeypatch.delenv(LAUNCHER_PID, raising=False)
    monkeypatch.setattr(failures, "QUIET_RANK_GRACE_S", 0)
    return lambda n: monkeypatch.setenv("RANK", str(n))


def test_under_torchrun_a_refusal_alike_on_every_rank_is_rank_0s_to_print(torchrun_rank, monkeypatch):
    """Rank 0 says it at once; another rank first waits for rank 0's exit to end the job (torchrun
    stops it then, tests/distributed/test_failure.py), and says it itself if it is still running
    after the wait: rank 0 did not raise it."""
    import framework.strategies.launchers.worker_failures as failures
    from framework.errors import raised_alike_on_every_rank
    from framework.strategies.launchers.worker_failures import said_by_another_process

    waits: list[float] = []
    monkeypatch.setattr(failures.time, "sleep", waits.append)
    with pytest.raises(ConfigError) as alike, raised_alike_on_every_rank():
        raise ConfigError(REFUSAL)
    own = ConfigError("checkpoint 'x.ckpt' does not exist")  # a file: one node may lack it
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")
    for rank, waited in ((0, []), (1, [failures.QUIET_RANK_GRACE_S])):
        torchrun_rank(rank)
        waits.clear()
        assert said_by_another_process(alike.value) is False
        assert waits == waited
        waits.clear()
        assert said_by_another_process(own) is False and waits == []  # a rank's own error: said at once
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")  # mpiexec or srun: no launcher stops rank 1, rank 0 says it
    assert said_by_another_process(alike.value) is True and waits == []


def test_refusals_from_the_configuration_alone_are_marked_alike_and_others_are_not(tmp_path):
    import torch
    import torch.nn as nn

    import framework as fw
    from framework.config import load_recipe
    from framework.parallel import _divide_head_counts
    from framework.strategies.fsdp.options import precision_policy

    def refusal(fn):
        with pytest.raises(ConfigError) as raised:
            fn()
        return raised.value

    class Attention(nn.Module):
        n_head = 3

    alike = [refusal(lambda: fw.Trainer(accumulate_grad_batches=0)),
             refusal(lambda: load_recipe(REPO / "conf" / "digits.yaml", ["trainer.max_epochs=abc"])),
             refusal(lambda: precision_policy("16-mixed")),
             refusal(lambda: _divide_head_counts(Attention(), 2))]
    assert all(err.alike_on_every_rank for err in alike), alike
    own = [refusal(lambda: load_recipe(str(tmp_path / "nope.yaml")))]  # a file one node may lack
    if not torch.cuda.is_available():  # a device one node may lack
        own.append(refusal(lambda: fw.Trainer(accelerator="cuda", devices=1)))
    assert not any(err.alike_on_every_rank for err in own), own


def test_a_recipe_that_reads_the_environment_is_not_alike_on_every_rank(tmp_path, monkeypatch):
    """A resolver (``${oc.env:...}``) may give each node its own value: its errors are each rank's."""
    from framework.config import load_recipe

    monkeypatch.delenv("FW_TEST_NOT_SET", raising=False)
    plain, env = tmp_path / "plain.yaml", tmp_path / "env.yaml"
    plain.write_text("seed: 1\nmodule: {_target_: x.Y}\ntrainer: {max_epochs: -5}\nbogus: 1\n")
    env.write_text("seed: ${oc.env:FW_TEST_NOT_SET}\nmodule: {_target_: x.Y}\n")
    with pytest.raises(ConfigError) as fixed:
        load_recipe(plain)
    with pytest.raises(ConfigError) as per_node:
        load_recipe(env)
    assert fixed.value.alike_on_every_rank and not per_node.value.alike_on_every_rank
