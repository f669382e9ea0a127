"""A stuck rank shows its line: the hang report names the file, line and code each rank is at.

One 2-rank fit, three places where rank 1 (or rank 0) gets stuck, each longer than a report's
time (a third of ``trainer.strategy.timeout``) and shorter than the timeout:

- batch 2: rank 1 loops in its ``training_step`` (a busy loop);
- batch 5: rank 1's data set sleeps in ``__getitem__`` (in the loader's worker process with
  ``num_workers=1``, in the main thread with 0);
- batch 7: rank 0 calls an ``all_reduce`` (on a group of the user's) that rank 1 skips: rank 1
  waits in the gradient sync, rank 0 in its collective, until the timeout ends the job. (A
  skipped collective on the default group is not a hang under Gloo: the next one meets it with
  another size, and Gloo aborts: "Received data size doesn't match expected size".)

Each report must arrive before the timeout and name the script's lines (computed from its text).
Under fw's launcher and torchrun the ranks' heartbeats report (``trainer/heartbeat.py``), under
mpiexec the MPI group's watchdog (``strategies/mpi/threads.py``). The default set covers each
launcher once (every stuck place in each); FW_FULL_HANG_MATRIX=1 runs every launcher with and
without loader workers.
"""

from __future__ import annotations

import os
import re
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
from mpi_helpers import mpiexec, skip_reason
from timescale import scaled

from framework.strategies.launchers.processes import kill_tree

from .helpers import PREAMBLE, PYTHON, Result, clean_env, free_port, write_script

TIMEOUT_S = 9  # trainer.strategy.timeout: a report every 3 s
STUCK_S = 6.5  # each stuck place: a report's time and more, and some seconds less than the timeout

SCRIPT = """
import datetime
import sys
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

import framework as fw
import workload

WORKERS, STUCK_S, STRATEGY, TIMEOUT_S = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], float(sys.argv[4])


class Data(Dataset):
    def __init__(self):
        self.data, self.taken = workload.regression_data(64), 0

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        self.taken += 1
        if self.taken == 4 * 5 + 1 and dist.get_rank() == 1:  # the first sample of rank 1's batch 5
            time.sleep(STUCK_S)
        return self.data[i]


class Stuck(workload.Regressor):
    def setup(self, stage):
        self.group = dist.new_group(timeout=datetime.timedelta(seconds=TIMEOUT_S))  # a group of the user's

    def training_step(self, batch, batch_idx):
        if batch_idx == 2 and self.global_rank == 1:
            end = time.monotonic() + STUCK_S
            while time.monotonic() < end: pass
        if batch_idx == 7 and self.global_rank == 0:
            dist.all_reduce(torch.ones(1), group=self.group)
        return super().training_step(batch, batch_idx)


trainer = fw.Trainer(devices=2, strategy={"name": STRATEGY, "timeout": TIMEOUT_S}, max_epochs=1, **workload.FIT_ARGS)
trainer.fit(Stuck(), DataLoader(Data(), batch_size=4, num_workers=WORKERS))
"""

LAUNCHERS = {  # launcher -> the loader workers of the default set
    "fw": 1,
    "torchrun": 0,
    "mpiexec": 1,
}
CASES = [(launcher, workers) for launcher in LAUNCHERS for workers in (0, 1)
         if os.environ.get("FW_FULL_HANG_MATRIX") == "1" or workers == LAUNCHERS[launcher]]


def _line(script: str, code: str) -> str:
    """'job.py:31 while time.monotonic() < end: pass': where ``code`` is in the script."""
    lines = script.splitlines()
    (number,) = [i + 1 for i, text in enumerate(lines) if text.strip() == code]
    return f"job.py:{number} {code}"


class Jobs:
    """The jobs of ``CASES``, all started at once (most of a job's time is waiting: at once, the
    default set takes the time of its slowest job, not the sum), each writing to a file."""

    def __init__(self, root: Path) -> None:
        self.root, self.started = root, {}
        for launcher, workers in CASES:
            if launcher == "mpiexec" and skip_reason() is not None:
                continue
            folder = root / f"{launcher}-{workers}"
            folder.mkdir()
            script = write_script(folder, SCRIPT)
            args = (str(workers), str(STUCK_S), "mpi" if launcher == "mpiexec" else "ddp_gloo", str(TIMEOUT_S))
            if launcher == "mpiexec":
                cmd = [mpiexec(), "-n", "2", PYTHON, str(script), *args]
            elif launcher == "torchrun":
                cmd = [PYTHON, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
                       "--master-port", str(free_port()), str(script), *args]
            else:
                cmd = [PYTHON, str(script), *args]
            out = open(folder / "output.txt", "w")  # noqa: SIM115 (closed in stop)
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=clean_env(), cwd=folder,
                                    start_new_session=True)
            self.started[launcher, workers] = (proc, out, time.monotonic())

    def result(self, case: tuple[str, int], timeout: float) -> Result:
        """The job's outcome, once it has ended (failing the test past ``timeout``)."""
        proc, _, start = self.started[case]
        try:
            proc.wait(timeout=max(1.0, start + scaled(timeout) - time.monotonic()))
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            proc.wait()
            raise AssertionError(f"{case} did not end within {timeout} s:\n{self._output(case)}") from None
        return Result(proc.returncode, self._output(case), time.monotonic() - start)

    def _output(self, case: tuple[str, int]) -> str:
        return (self.root / f"{case[0]}-{case[1]}" / "output.txt").read_text()

    def stop(self) -> None:
        for proc, out, _ in self.started.values():
            if proc.poll() is None:
                kill_tree(proc.pid)
                proc.wait()
            out.close()


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    started = Jobs(tmp_path_factory.mktemp("stuck"))
    try:
        yield started
    finally:
        started.stop()


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("launcher", "workers"), [
    pytest.param(launcher, workers, marks=[pytest.mark.mpi] if launcher == "mpiexec" else [],
                 id=f"{launcher}-{workers}-workers") for launcher, workers in CASES])
def test_a_stuck_rank_is_reported_at_its_line(jobs, launcher, workers):
    if launcher == "mpiexec" and skip_reason() is not None:
        pytest.skip(skip_reason())
    text = PREAMBLE + textwrap.dedent(SCRIPT)  # the script as write_script wrote it
    loop = _line(text, "while time.monotonic() < end: pass") + " in training_step"
    sleep = _line(text, "time.sleep(STUCK_S)") + " in __getitem__" + (" (data loader worker 0, pid " if workers else "")
    skipped = _line(text, "dist.all_reduce(torch.ones(1), group=self.group)") + \
        " in training_step, in torch.distributed's all_reduce"
    result = jobs.result((launcher, workers), timeout=180)
    assert result.returncode != 0, result.output  # the skipped collective ends the job at the timeout
    lines = result.output.splitlines()

    def report(start: str, *parts: str) -> str:
        """The first line that starts so and holds every part, which came before the timeout."""
        found = [line for line in lines if line.startswith(start) and all(part in line for part in parts)]
        assert found, f"no line starting {start!r} with {parts}:\n{result.output}"
        waited = re.search(r"(?:has been .*? for|has waited) (\d+) s", found[0])
        assert waited and int(waited.group(1)) < TIMEOUT_S, found[0]
        return found[0]

    if launcher == "mpiexec":  # the watchdog: the waiting rank names the absent one's line; that one says it too
        on_batch = " in MPI all-reduce (the backward pass's gradient sync) for the other ranks"
        report("fw: rank 0 of 2 has waited", on_batch, "rank 1 had not arrived", f": rank 1 is in training_step, at {loop}")
        report("fw: rank 1 of 2 is in training_step, at " + loop, ", and rank 0 has waited")
        report("fw: rank 0 of 2 has waited", on_batch, f": rank 1 is at {sleep}")
        report("fw: rank 1 of 2 is at " + sleep)
        report("fw: rank 1 of 2 has waited", on_batch, f": rank 0 is in training_step, at {skipped}")
        report(f"fw: rank 0 of 2 is in training_step, at {skipped}, and rank 1 has waited")
        # both ranks wait in a collective (rank 0 in the skipped one, rank 1 in the gradient sync), each with
        # the same timeout: whichever reaches it first ends the job
        assert re.search(r"fw: error: rank [01] of 2 waited", result.output), result.output
        return
    # the heartbeat: every rank reports its own line and the others'
    in_sync = "in the backward pass's gradient sync"
    report(f"fw: rank 0 of 2 has been in epoch 0, batch 2, {in_sync} for",
           f"waiting for the other ranks: rank 1 is in epoch 0, batch 2, in training_step, at {loop} (")
    report("fw: rank 1 of 2 has been in epoch 0, batch 2, in training_step for",
           f" s, at {loop}, the other ranks may be waiting for it: rank 0 is in epoch 0, batch 2, {in_sync} (")
    report(f"fw: rank 0 of 2 has been in epoch 0, batch 5, {in_sync} for",
           f"waiting for the other ranks: rank 1 is in epoch 0, batch 5, at {sleep}")
    report("fw: rank 1 of 2 has been in epoch 0, batch 5 for", f" s, at {sleep}")
    report("fw: rank 0 of 2 has been in epoch 0, batch 7, in training_step for",
           f" s, at {skipped}, waiting for the other ranks: rank 1 is in epoch 0, batch 7, {in_sync} (")
    report(f"fw: rank 1 of 2 has been in epoch 0, batch 7, {in_sync} for",
           f"waiting for the other ranks: rank 0 is in epoch 0, batch 7, in training_step, at {skipped} (")
    timed_out = f"fw: rank 1 of 2 waited {TIMEOUT_S} s for the other ranks in the backward pass's gradient sync"
    assert timed_out in result.output, result.output
    # each report came before the timeout ended the job (the lines of one process keep their order)
    assert result.output.index(timed_out) > result.output.index("fw: rank 1 of 2 has been in epoch 0, batch 7"), \
        result.output
