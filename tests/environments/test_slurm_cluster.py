"""fw under a real SLURM cluster: any SLURM with a node up (CI brings up a one-node test cluster
before the tests, see .ci/run); without one these tests skip, saying why.

``srun -n2`` runs two DDP ranks that find each other from SLURM's variables alone, and an
``sbatch`` script that forgets ``srun`` gets the batch-script trap explained instead of a hang.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from conftest import subprocess_env
from timescale import scaled
from toy import freezing_script

pytestmark = pytest.mark.slurm


@functools.cache
def _slurm_up() -> str | None:
    if not shutil.which("srun") or not shutil.which("sinfo"):
        return "SLURM is not installed here (srun and sinfo not found); these tests need a SLURM cluster with a node up"
    proc = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=20)
    # comp: finishing the last job; a new one waits for it
    if proc.returncode != 0 or not any(s in proc.stdout for s in ("idle", "mix", "alloc", "comp")):
        return f"no SLURM node is up ({(proc.stdout + proc.stderr).strip()[:100]})"
    return None


@pytest.fixture
def slurm_cluster() -> None:
    """Skips, saying why, without a SLURM node up. Asked at set-up, not at import: where SLURM is
    installed but its controller is down, sinfo takes seconds to say so, and a run that leaves
    the cluster tests out (the fast tier) should not wait for it."""
    reason = _slurm_up()
    if reason is not None:
        pytest.skip(reason)


needs_slurm = pytest.mark.usefixtures("slurm_cluster")
#: a job's states once it has ended (``scontrol show job``)
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
         "PREEMPTED"}


def show_job(job: str) -> str:
    return subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True, timeout=20).stdout


def job_field(shown: str, name: str) -> str:
    """A field of what ``scontrol show job`` showed (``JobState``, ``ExitCode``, ...); ``GONE``
    where it showed nothing (the controller has forgotten the job)."""
    for field in shown.split():
        if field.startswith(f"{name}="):
            return field.split("=", 1)[1]
    return "GONE"


def wait_for_job(job: str, timeout: float) -> tuple[str, str]:
    """The job's end state and exit code (``1:0``), read twice a second: ``sbatch --wait``
    checks after 2, 10 and then every 32 s, so a job that ends at 11 s is seen ended at 42 s.
    ``timeout`` is for the reference machine (tests/timescale.py)."""
    timeout = scaled(timeout)
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        shown = show_job(job)
        if job_field(shown, "JobState") in ENDED:
            return job_field(shown, "JobState"), job_field(shown, "ExitCode")
        time.sleep(0.5)
    subprocess.run(["scancel", job], capture_output=True, timeout=20)
    raise AssertionError(f"SLURM job {job} did not end within {timeout} s:\n{show_job(job)}")


SCRIPT = textwrap.dedent(
    """
    import sys, torch, framework as fw
    from toy import LinearModel, loader, regression_data
    out = sys.argv[1]
    torch.set_num_threads(1)
    trainer = fw.Trainer(accelerator="cpu", devices=2, strategy="ddp_gloo", max_epochs=2, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, num_sanity_val_steps=0)
    model = LinearModel(lr=0.05)
    trainer.fit(model, loader(regression_data(32), 4))
    info = trainer.strategy.dist
    torch.save({"params": model.state_dict(), "source": info.source, "world": info.world_size,
                "port": info.master_port}, f"{out}/rank{trainer.global_rank}.pt")
    """
)


@needs_slurm
@pytest.mark.timeout(60)
def test_srun_two_tasks_train_as_one_ddp_job(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    proc = subprocess.run(
        ["srun", "-N1", "-n2", "--kill-on-bad-exit=1", "--time=3", sys.executable, str(script), str(tmp_path)],
        env=subprocess_env(), capture_output=True, text=True, timeout=150,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    r0, r1 = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")
    assert r0["source"] == r1["source"] == "slurm" and r0["world"] == 2
    assert 15000 <= r0["port"] < 25000  # derived from the job id
    from toy import QUIET, LinearModel, loader, regression_data

    import framework as fw

    single = LinearModel(lr=0.05)
    fw.Trainer(max_epochs=2, **QUIET).fit(single, loader(regression_data(32), 8))
    for key, value in single.state_dict().items():
        assert torch.equal(r0["params"][key], r1["params"][key])
        torch.testing.assert_close(r0["params"][key], value, atol=1e-5, rtol=0)


@needs_slurm
@pytest.mark.timeout(60)
def test_sbatch_without_srun_is_explained_not_a_hang(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    log = tmp_path / "slurm.out"
    batch = tmp_path / "job.sh"
    batch.write_text(f"#!/bin/bash\n{sys.executable} -m framework.cli env > /dev/null\n"
                     f"{sys.executable} {script} {tmp_path}\n")
    submitted = subprocess.run(["sbatch", "--parsable", "-N1", "--ntasks=2", "--time=2", f"--output={log}", str(batch)],
                               env=subprocess_env(), capture_output=True, text=True, timeout=30)
    assert submitted.returncode == 0, submitted.stderr
    state, exit_code = wait_for_job(submitted.stdout.strip().split(";")[0], timeout=50)
    assert state == "FAILED" and exit_code != "0:0", (state, exit_code)
    text = log.read_text()
    assert "outside srun" in text and "srun" in text.split("outside srun", 1)[1]
    assert not (tmp_path / "rank0.pt").exists()




@needs_slurm
@pytest.mark.timeout(60)
def test_a_rank_that_stops_answering_under_srun_ends_the_step(tmp_path):
    """Without --kill-on-bad-exit srun waits for every task: the rank that timed out ends the step."""
    script = tmp_path / "stopped.py"
    script.write_text(freezing_script({"name": "ddp_gloo", "timeout": 6}))
    start = time.monotonic()
    proc = subprocess.run(["srun", "-N1", "-n2", "--time=2", sys.executable, str(script)],
                          env=subprocess_env(), capture_output=True, text=True, timeout=100)
    elapsed = time.monotonic() - start
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output
    assert "fw: rank 0 of 2 waited 6 s for the other ranks in the backward pass's gradient sync (trainer.strategy.timeout)" in output, output
    assert "fw: rank 0 failed: ending SLURM step" in output, output
    assert elapsed < 60, f"took {elapsed:.1f} s\n{output}"


THREADS = textwrap.dedent(
    """
    import sys, torch, framework as fw
    from toy import LinearModel, loader, regression_data
    trainer = fw.Trainer(accelerator="cpu", devices=2, strategy="ddp_gloo", max_epochs=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(LinearModel(), loader(regression_data(16), 4))
    print(f"rank {trainer.global_rank} threads {torch.get_num_threads()}", flush=True)
    """
)


@needs_slurm
@pytest.mark.timeout(60)
@pytest.mark.parametrize("omp", [None, "2"])
def test_under_srun_each_task_gets_its_share_of_the_cores_unless_the_user_chose(tmp_path, omp):
    """srun leaves every task with all cores' threads (4-40x slower per step on 2 cores): fw
    gives each its share (cores / tasks on the node) and says so in the run summary."""
    import os

    script = tmp_path / "threads.py"
    script.write_text(THREADS)
    env = {k: v for k, v in subprocess_env().items() if k != "OMP_NUM_THREADS"}
    if omp:
        env["OMP_NUM_THREADS"] = omp
    proc = subprocess.run(["srun", "-N1", "-n2", "--time=2", sys.executable, str(script)], env=env,
                          capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    expected = int(omp) if omp else max(1, (os.cpu_count() or 2) // 2)
    assert sorted(line for line in proc.stdout.splitlines() if line.startswith("rank")) == \
        [f"rank 0 threads {expected}", f"rank 1 threads {expected}"]
    assert f"world size 2, {expected} thread(s) per process" in proc.stderr
