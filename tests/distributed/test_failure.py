"""Property 6: a rank that raises mid-epoch ends the whole job quickly with its error; a rank
whose peer never arrives fails after the strategy's timeout with a message that says why."""

from __future__ import annotations

import re

import pytest

from .helpers import FW, clean_env, free_port, run_cmd, run_script, write_script

CRASH = """
import torch
from torch.utils.data import DataLoader
import framework as fw
import workload

class Crashing(workload.IndexRecorder):
    def training_step(self, batch, batch_idx):
        if self.trainer.global_rank == 1 and batch_idx == 3:
            raise ValueError("boom at batch 3")
        return super().training_step(batch, batch_idx)

trainer = fw.Trainer(devices=2, strategy={"name": "ddp_gloo", "timeout": 120}, max_epochs=1, **workload.FIT_ARGS)
trainer.fit(Crashing(), train_dataloaders=DataLoader(workload.IndexData(40), batch_size=2))
print("finished without the error", flush=True)
"""


@pytest.mark.timeout(90)
@pytest.mark.parametrize("launcher", ["fw", "torchrun"])
def test_crashing_rank_stops_the_job(launcher, tmp_path):
    # the strategy timeout (120 s) is far above the bound: the job must end because the
    # launcher stops the surviving rank, not because a collective timed out
    result = run_script(write_script(tmp_path, CRASH), launcher=launcher, timeout=75)
    assert result.returncode != 0, result.output
    assert result.wall_s < 60, f"took {result.wall_s:.1f} s"
    assert "boom at batch 3" in result.output
    assert "finished without the error" not in result.output
    if launcher == "fw":
        assert "fw: error: worker rank 1" in result.output, result.output


PEER_TIMEOUT_S = 8


@pytest.fixture(scope="module")
def rank_0_without_its_peer():
    """``fw fit`` as rank 0 of 2 on node 0, whose other node never comes: run once, with a timeout
    (8 s) past the first "waiting" line (5 s), for both tests below. One process with torchrun's
    variables and no launcher: a forked copy of this process (tests/forked.py), not a fresh one."""
    import time

    import forked

    from .helpers import REPO, Result

    env = clean_env(RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", GROUP_RANK="0",
                    GROUP_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    args = ["fit", "conf/digits.yaml", "trainer.devices=1", "trainer.num_nodes=2",
            f"trainer.strategy={{name: ddp_gloo, timeout: {PEER_TIMEOUT_S}}}", "logger=false", "callbacks=[]"]
    start = time.monotonic()
    done = forked.fw_command(*args, cwd=REPO, env=env, timeout=45)
    return Result(done.returncode, done.stdout + done.stderr, time.monotonic() - start)


@pytest.mark.timeout(90)
def test_missing_peer_times_out_with_clear_error(rank_0_without_its_peer):
    result = rank_0_without_its_peer
    assert result.returncode == 1, result.output
    assert result.wall_s < 40, f"took {result.wall_s:.1f} s"
    error = [line for line in result.output.splitlines() if line.startswith("fw: error:")]
    assert error, result.output
    assert f"timed out after {PEER_TIMEOUT_S} s" in error[0] and "1 of 2 ranks arrived" in error[0], error[0]
    assert "Check that all 2 ranks were started" in error[0]
    assert "Traceback" not in result.output


@pytest.mark.timeout(60)
def test_a_missing_peer_is_announced_while_waiting_and_the_default_timeout_suits_a_first_run(rank_0_without_its_peer):
    from framework.strategies import DDPStrategy, MPIStrategy

    assert DDPStrategy().timeout == MPIStrategy().timeout == 300  # 5 minutes, not torch's 30
    result = rank_0_without_its_peer
    assert result.returncode == 1, result.output
    waiting = [line for line in result.output.splitlines() if "is waiting for the other ranks" in line]
    assert waiting and waiting[0].startswith("fw: rank 0 of 2 is waiting for the other ranks at env:// (127.0.0.1:")
    assert f"of the {PEER_TIMEOUT_S} s timeout, trainer.strategy.timeout" in waiting[0]
    assert f"timed out after {PEER_TIMEOUT_S} s" in result.output


STOPPED = """
import os, signal, sys, time
from torch.utils.data import DataLoader
import framework as fw
import workload

class Freezes(workload.Regressor):
    def training_step(self, batch, batch_idx):
        if self.global_rank == 1 and batch_idx == 3:
            if sys.argv[1:] == ["loop"]:  # stuck in user code: alive (its heartbeat goes on), not arriving
                end = time.monotonic() + 20
                while self.trainer.state.signal is None and time.monotonic() < end:  # until the job is stopped
                    time.sleep(0.01)
                os._exit(1)
            os.kill(os.getpid(), signal.SIGSTOP)  # stops answering, without dying
        return super().training_step(batch, batch_idx)

trainer = fw.Trainer(devices=2, strategy={"name": "ddp_gloo", "timeout": 5}, max_epochs=2, **workload.FIT_ARGS)
trainer.fit(Freezes(), DataLoader(workload.regression_data(64), batch_size=4))
"""


@pytest.mark.timeout(200)
@pytest.mark.parametrize("launcher", ["fw", "torchrun"])
def test_a_rank_that_stops_answering_ends_the_job_after_the_timeout(tmp_path, launcher):
    result = run_script(write_script(tmp_path, STOPPED), launcher=launcher, timeout=160)
    assert result.returncode != 0, result.output
    # torchrun's agent SIGKILLs the stopped worker 30 s after its SIGTERM (a fixed wait, not its
    # --shutdown-timeout); fw's launcher resumes it at once (SIGCONT) so that it acts on the
    # SIGTERM (asserted below from its output: a bound on the wall time alone fails under load)
    assert result.wall_s < 80, f"took {result.wall_s:.1f} s"
    # the job ends with the collective rank 0 waited in, and while it waits it says where and for whom
    assert "fw: rank 0 of 2 waited 5 s for the other ranks in the backward pass's gradient sync " \
        "(trainer.strategy.timeout)" in result.output, result.output
    waiting = [line for line in result.output.splitlines()
               if line.startswith("fw: rank 0 of 2 has been in epoch 0, batch 3, in the backward pass's gradient sync for")]
    assert any("rank 1 stopped answering" in line for line in waiting), result.output
    if launcher == "fw":
        assert "fw: error: worker rank 0" in result.output and "Timed out" in result.output, result.output
        assert "is stopped with SIGTERM pending: resumed it (SIGCONT)" in result.output, result.output
        assert "fw: rank 1 received SIGTERM" in result.output, result.output


@pytest.mark.timeout(90)
def test_a_rank_stuck_in_its_training_step_is_named_with_where_it_is(tmp_path):
    """Alive but never arriving (a loop in user code): rank 0, waiting in the gradient sync, says
    that rank 1 is in its training_step at the same batch, then the job ends at the timeout."""
    result = run_script(write_script(tmp_path, STOPPED), "loop", launcher="fw", timeout=80)
    assert result.returncode != 0, result.output
    waiting = [line for line in result.output.splitlines()
               if line.startswith("fw: rank 0 of 2 has been in epoch 0, batch 3, in the backward pass's gradient sync for")]
    assert any("rank 1 is in epoch 0, batch 3, in training_step" in line for line in waiting), result.output
    assert "fw: rank 0 of 2 waited 5 s for the other ranks in the backward pass's gradient sync" in result.output


BOTH = """
import time
from torch.utils.data import DataLoader
import framework as fw
import workload

class BothRaise(workload.IndexRecorder):
    def training_step(self, batch, batch_idx):
        if batch_idx == 3:
            if self.trainer.global_rank == 0:
                time.sleep(0.3)  # rank 1 fails first
            raise ValueError(f"rank {self.trainer.global_rank} cannot go on")
        return super().training_step(batch, batch_idx)

trainer = fw.Trainer(devices=2, strategy={"name": "ddp_gloo", "timeout": 120}, max_epochs=1, **workload.FIT_ARGS)
trainer.fit(BothRaise(), train_dataloaders=DataLoader(workload.IndexData(40), batch_size=2))
"""


@pytest.mark.timeout(90)
def test_ranks_that_raise_give_one_traceback_the_first_failures(tmp_path):
    result = run_script(write_script(tmp_path, BOTH), launcher="fw", timeout=75)
    assert result.returncode == 1, result.output
    assert result.output.count("Traceback (most recent call last)") == 1, result.output
    lines = result.output.splitlines()
    first = next(line for line in lines if line.startswith("fw: error: worker rank"))
    assert first.startswith("fw: error: worker rank 1 (pid ") and "failed with exit code 1: ValueError: rank 1 cannot " \
        "go on" in first, result.output
    traceback_at = lines.index("rank 1's traceback:")
    assert lines[traceback_at + 1] == "Traceback (most recent call last):"
    assert "ValueError: rank 1 cannot go on" in lines[traceback_at + 2:]
    others = [line for line in lines if line.startswith("fw: worker rank 0 (pid ")]
    # rank 0 either failed too (its own error, or its peer's disappearance) or was stopped first
    assert len(others) <= 1 and ("1 other rank(s) failed too" in first) == bool(others), result.output


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("overrides", "line"), [
    (["trainer.strategy=fsdp", "trainer.precision=16-mixed"],
     "fw: error: trainer.precision=16-mixed with strategy fsdp: not supported (16-mixed needs a sharded gradient "
     "scaler); use trainer.precision=bf16-mixed, bf16-true or 32-true"),
    (["trainer.strategy=model_parallel"],
     "fw: error: strategy model_parallel: DigitsClassifier does not override configure_model(), where the model is "
     "parallelized over self.device_mesh; add it (one line: fw.parallel.parallelize(self.model, self.device_mesh, "
     "blocks={Block})), or use strategy fsdp"),
], ids=["16-mixed-under-fsdp", "model-parallel-without-configure-model"])
def test_a_refusal_every_rank_raises_at_set_up_is_one_line_once(overrides, line):
    """Every worker refuses the run alike: the launcher prints the line once, with no traceback,
    and exits as ``fw`` does in one process (2: the recipe is wrong)."""
    cmd = [FW, "fit", "conf/digits.yaml", "trainer.devices=2", "trainer.max_epochs=1", "logger=false", *overrides]
    result = run_cmd(cmd, timeout=90)
    assert result.output.splitlines() == [line], result.output
    assert result.returncode == 2


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("overrides", "line"), [
    (["trainer.strategy=fsdp", "trainer.precision=16-mixed"],
     "fw: error: trainer.precision=16-mixed with strategy fsdp: not supported (16-mixed needs a sharded gradient "
     "scaler); use trainer.precision=bf16-mixed, bf16-true or 32-true"),
    (["trainer.strategy=ddp_gloo", "trainer.accumulate_grad_batches=0"],
     "fw: error: trainer.accumulate_grad_batches=0: must be an integer >= 1"),
], ids=["16-mixed-under-fsdp", "a-wrong-trainer-argument"])
def test_under_torchrun_a_refusal_every_rank_raises_alike_is_printed_by_rank_0_alone(overrides, line):
    """fw does not own torchrun's parent: rank 0 prints the line, rank 1 exits with the same code
    quietly (torchrun then adds its own report of the failed workers)."""
    from .helpers import PYTHON

    cmd = [PYTHON, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), "-m", "framework.cli", "fit", "conf/digits.yaml", "trainer.devices=2",
           "trainer.max_epochs=1", "logger=false", *overrides]
    result = run_cmd(cmd, timeout=90)
    assert result.returncode != 0
    assert [x for x in result.output.splitlines() if x.startswith("fw: error:")] == [line], result.output
    # the code of the rank that says it is the refusal's (torchrun's log line, or its report when the
    # agent stopped the quiet rank first: "exitcode  : 2")
    assert re.search(r"failed \(exitcode: 2\)|exitcode\s+: 2 ", result.output), result.output


CAUGHT = """
import sys
from torch.utils.data import DataLoader
import framework as fw
import workload
from framework.errors import CheckpointError

trainer = fw.Trainer(devices=2, strategy={"name": "ddp_gloo", "timeout": 120}, max_epochs=1, **workload.FIT_ARGS)
loader = DataLoader(workload.IndexData(8), batch_size=2)
try:
    trainer.fit(workload.IndexRecorder(), train_dataloaders=loader, ckpt_path="no-such-file.ckpt")
except CheckpointError:
    trainer.fit(workload.IndexRecorder(), train_dataloaders=loader)  # no checkpoint yet: start fresh
results = {}
print(results["val/acc"])  # the user's own bug, after training
"""


@pytest.mark.timeout(120)
def test_an_error_the_user_caught_is_not_reported_for_the_one_that_ended_the_workers(tmp_path):
    """The error file held the first error of a Trainer call even when the script caught it, and
    the launcher reported that (fw: error: checkpoint ... does not exist) in place of the KeyError
    that ended the workers, whose traceback nobody printed."""
    result = run_script(write_script(tmp_path, CAUGHT), launcher="fw", timeout=100)
    assert result.returncode == 1, result.output
    assert "does not exist" not in result.output, result.output
    assert result.output.count("Traceback (most recent call last)") == 1, result.output
    assert "KeyError: 'val/acc'" in result.output, result.output


ENV_SEED = """
import pathlib, sys
text = pathlib.Path("conf/digits.yaml").read_text().replace("seed: 42", "seed: ${oc.env:SEED_OF_RANK_${oc.env:RANK}}")
pathlib.Path(sys.argv[1]).write_text(text)
"""


@pytest.mark.timeout(120)
def test_under_torchrun_a_recipe_error_of_one_rank_alone_is_still_said(tmp_path):
    """A recipe's ${oc.env:...} can resolve on one node and fail on another: rank 1's error is not
    rank 0's, so rank 1 says it (it waited for rank 0 to end the job with the same line, in vain);
    fw printed nothing, and torchrun's report had no error."""
    from .helpers import PYTHON

    recipe = tmp_path / "env_seed.yaml"
    run_cmd([PYTHON, "-c", ENV_SEED, str(recipe)], timeout=30)
    cmd = [PYTHON, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), "-m", "framework.cli", "fit", str(recipe), "trainer.devices=2",
           "trainer.max_epochs=1", "logger=false", f"trainer.default_root_dir={tmp_path}"]
    result = run_cmd(cmd, timeout=100, env=clean_env(SEED_OF_RANK_0="42"))
    assert result.returncode != 0
    errors = [x for x in result.output.splitlines() if x.startswith("fw: error:")]
    assert len(errors) == 1 and "SEED_OF_RANK_1" in errors[0], result.output
