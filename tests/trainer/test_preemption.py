"""Preemption and Ctrl-C: SIGTERM, SIGUSR1 (the preemption signal) and SIGINT make every rank
finish its step and stop together; a checkpoint is written, the job exits 0 with a message,
and the run resumed from that checkpoint ends bit-identical to one never stopped. Signals go to
a single process, to fw's launcher and to one of its workers; a launcher killed outright takes
its workers with it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import forked
import pytest
from distributed.helpers import PYTHON, _descendants, _kill_tree, check_ok, clean_env, write_script
from timescale import scaled

SCRIPT = """
import json, os, sys, time
from pathlib import Path
import torch, torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader
import framework as fw
import workload

out, name, devices = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
ckpt = sys.argv[4] if len(sys.argv) > 4 else None

class Slow(workload.Regressor):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.2)
    def training_step(self, batch, batch_idx):
        if name == "stopped":
            time.sleep(0.05)
            if self.global_step == 3 and self.global_rank == 0:
                (out / "started").write_text(str(os.getpid()))
        x, y = batch
        return F.mse_loss(self.net(self.drop(x)), y)

fw.seed_everything(0)
model = Slow()
trainer = fw.Trainer(devices=devices, strategy="ddp_gloo" if devices > 1 else "single", max_epochs=4,
                     default_root_dir=str(out / "root"), **workload.FIT_ARGS)
trainer.fit(model, DataLoader(workload.regression_data(64), batch_size=4, shuffle=True), ckpt_path=ckpt)
with open(out / f"{name}_rank{trainer.global_rank}.json", "w") as f:
    json.dump({"step": trainer.global_step, "w": torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()}, f)
"""


def _start(script: Path, out: Path, devices: int) -> subprocess.Popen:
    return subprocess.Popen([PYTHON, str(script), str(out), "stopped", str(devices)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=clean_env(), start_new_session=True)


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, f"ended before training started:\n{proc.communicate()[0]}"
        assert time.monotonic() < end, "training did not start"
        time.sleep(0.05)


def _finish(proc: subprocess.Popen, timeout: float = 60) -> str:
    try:
        out, _ = proc.communicate(timeout=scaled(timeout))
    except subprocess.TimeoutExpired:
        _kill_tree(proc.pid)
        raise AssertionError(f"did not end within {timeout} s:\n{proc.communicate()[0]}") from None
    return out


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> dict[int, list[dict]]:
    """The uninterrupted run, per world size (1, 2): the same whichever signal stops the other.
    No launcher is under test in it, nor in the resumed runs: their ranks are forked from this
    process (tests/forked.py); the stopped runs are real, signals and launcher included."""
    out = tmp_path_factory.mktemp("straight")
    script = write_script(out, SCRIPT)
    runs = {}
    for devices in (1, 2):
        check_ok(forked.run_script(script, str(out), "straight", str(devices), nprocs=devices, timeout=30))
        runs[devices] = [json.loads((out / f"straight_rank{rank}.json").read_text()) for rank in range(devices)]
    return runs


def _check_resumes_exactly(script: Path, out: Path, devices: int, output: str, straight: list[dict]) -> None:
    checkpoint = out / "root" / "preempted.ckpt"
    assert checkpoint.is_file(), output
    assert f"resume with ckpt_path={checkpoint}" in output, output
    assert "Traceback" not in output, output
    check_ok(forked.run_script(script, str(out), "resumed", str(devices), str(checkpoint), nprocs=devices, timeout=30))
    for rank in range(devices):
        resumed = json.loads((out / f"resumed_rank{rank}.json").read_text())
        assert resumed == straight[rank], f"rank {rank}"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1, signal.SIGINT], ids=lambda s: s.name)
def test_a_signal_to_a_single_process_stops_it_with_a_checkpoint(tmp_path, sig, straight):
    script = write_script(tmp_path, SCRIPT)
    proc = _start(script, tmp_path, 1)
    _wait_for(tmp_path / "started", proc)
    os.kill(proc.pid, sig)
    output = _finish(proc)
    assert proc.returncode == 0, output
    assert f"fw: rank 0 received {sig.name}: stopping after this step" in output
    assert f"fw: stopped by {sig.name} at step" in output
    _check_resumes_exactly(script, tmp_path, 1, output, straight[1])


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("target", "sig"), [("launcher", signal.SIGTERM), ("launcher", signal.SIGUSR1), ("launcher", signal.SIGINT),
                                        ("worker", signal.SIGUSR1)],
                         ids=lambda v: v if isinstance(v, str) else v.name)
def test_a_signal_to_the_launcher_or_a_worker_stops_every_rank_with_a_checkpoint(tmp_path, target, sig, straight):
    script = write_script(tmp_path, SCRIPT)
    proc = _start(script, tmp_path, 2)
    _wait_for(tmp_path / "started", proc)
    pid = proc.pid if target == "launcher" else int((tmp_path / "started").read_text())  # rank 0's worker
    os.kill(pid, sig)
    output = _finish(proc)
    assert proc.returncode == 0, output
    assert f"received {sig.name}" in output, output
    _check_resumes_exactly(script, tmp_path, 2, output, straight[2])


@pytest.mark.timeout(45)
def test_no_worker_outlives_its_launcher(tmp_path):
    script = write_script(tmp_path, SCRIPT)
    proc = _start(script, tmp_path, 2)
    _wait_for(tmp_path / "started", proc)
    workers = _descendants(proc.pid)
    assert workers
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    end = time.monotonic() + 30
    alive = workers
    while alive and time.monotonic() < end:
        alive = [p for p in alive if _is_running(p)]
        time.sleep(0.1)
    try:
        assert not alive, f"workers {alive} outlived their launcher"
    finally:
        for p in alive:
            _kill_tree(p)


def _is_running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_after_a_stop_on_a_signal_the_same_trainer_validates_normally(tmp_path):
    import sys as _sys

    _sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from toy import QUIET, LinearModel, loader, regression_data

    import framework as fw

    class SignalAtStep3(fw.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if trainer.global_step == 3:
                os.kill(os.getpid(), signal.SIGTERM)

    trainer = fw.Trainer(**QUIET, max_epochs=5, default_root_dir=str(tmp_path), callbacks=[SignalAtStep3()])
    model = LinearModel()
    with pytest.raises(SystemExit) as stopped:  # a notebook catches this
        trainer.fit(model, loader(regression_data(32), 8), loader(regression_data(16), 8))
    assert stopped.value.code == 0 and trainer.global_step == 3 and (tmp_path / "preempted.ckpt").is_file()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL or callable(signal.getsignal(signal.SIGTERM))
    results = trainer.validate(model, loader(regression_data(16), 8))  # no second exit
    assert "val/loss" in results[0] and trainer.state.stop_reason is None


def test_a_signal_wins_over_max_time_as_the_stop_reason():
    from framework.run_state.state import RunState

    state = RunState()
    state.stop("max_time")
    state.stop("should_stop")
    assert state.stop_reason == "max_time"
    state.stop("preempted")
    assert state.stop_reason == "preempted"


def _a_trainer_in_a_launched_workers_child() -> str:
    os.environ["FW_LAUNCHER_PID"] = "1"  # inherited from a worker, whose launcher is not this process's parent
    import framework as fw

    fw.Trainer(accelerator="cpu", logger=False)
    return "alive"


def test_a_process_started_by_a_worker_is_not_taken_for_a_worker():
    """A process that inherited FW_LAUNCHER_PID from a worker, its parent not that launcher,
    builds a Trainer and lives on (as_launcher_worker leaves it alone); in a forked copy of this
    process (tests/forked.py: no launcher is under test, only the variable and the parent)."""
    assert forked.call(_a_trainer_in_a_launched_workers_child, timeout=60) == "alive"


SLOW_STEPS = """
import os, sys, time
from pathlib import Path
from torch.utils.data import DataLoader
import framework as fw
import workload

out = Path(sys.argv[1])

class Slow(workload.Regressor):
    def training_step(self, batch, batch_idx):
        time.sleep(0.5)  # 20 batches take 10 s: a launcher's grace period is not much longer
        if self.global_step == 2 and self.global_rank == 0:
            (out / "started").write_text(str(os.getpid()))
        return super().training_step(batch, batch_idx)

trainer = fw.Trainer(devices=2, strategy="ddp_gloo", max_epochs=1, default_root_dir=str(out / "root"),
                     **workload.FIT_ARGS)
trainer.fit(Slow(), DataLoader(workload.regression_data(256), batch_size=4))
"""


@pytest.mark.timeout(75)
def test_with_slow_steps_the_ranks_agree_to_stop_within_seconds_not_twenty_batches(tmp_path):
    """The joint stop check runs at least every ~5 s of training (StopCheck.TARGET_S), so a
    signal is acted on well within the 30 s a launcher waits before SIGKILL."""
    script = write_script(tmp_path, SLOW_STEPS)
    proc = subprocess.Popen([PYTHON, str(script), str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=clean_env(), start_new_session=True)
    _wait_for(tmp_path / "started", proc)
    sent = time.monotonic()
    os.kill(proc.pid, signal.SIGTERM)
    output = _finish(proc)
    assert proc.returncode == 0, output
    stopped = [line for line in output.splitlines() if "fw: stopped by SIGTERM at step" in line]
    assert stopped, output
    step = int(stopped[0].split("at step")[1].split()[0].strip(",:;"))
    assert 3 <= step <= 14, output  # signalled at step 2 or 3; 20 batches between checks would reach 20
    assert (tmp_path / "root" / "preempted.ckpt").is_file()
    assert time.monotonic() - sent < 30


EARLY = """
import os, signal, sys, time
from pathlib import Path
from torch.utils.data import DataLoader
import framework as fw
import workload

out = Path(sys.argv[1])
trainer = fw.Trainer(devices=2, strategy="ddp_gloo", max_epochs=2, default_root_dir=str(out / "root"),
                     **workload.FIT_ARGS)
if trainer.global_rank == 1:  # a worker, signalled while it starts (SLURM may, a minute early)
    (out / "early").write_text(str(os.getpid()))
    end = time.monotonic() + 20
    while not (out / "sent").exists() and time.monotonic() < end:
        time.sleep(0.05)
trainer.fit(workload.Regressor(), DataLoader(workload.regression_data(64), batch_size=4))
"""


@pytest.mark.timeout(60)
def test_a_signal_before_the_fit_waits_for_it_and_stops_it_with_a_checkpoint(tmp_path):
    """fw's launcher starts its workers with SIGUSR1 (the preemption signal) blocked: one sent to
    a worker before its fit installed its handlers (SLURM's --signal=USR1@90 may come that early;
    the default action would kill it) stops the fit at its first check with a checkpoint, and the
    job ends cleanly."""
    script = write_script(tmp_path, EARLY)
    proc = subprocess.Popen([PYTHON, str(script), str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=clean_env(), start_new_session=True)
    _wait_for(tmp_path / "early", proc)
    os.kill(int((tmp_path / "early").read_text()), signal.SIGUSR1)
    (tmp_path / "sent").write_text("")
    output = _finish(proc)
    assert proc.returncode == 0, output
    assert "fw: rank 1 received SIGUSR1: stopping after this step" in output, output
    assert "fw: stopped by a signal to another rank at step 1" in output, output
    assert (tmp_path / "root" / "preempted.ckpt").is_file()


def test_a_fit_puts_the_signal_mask_back_as_it_found_it(tmp_path, monkeypatch):
    """A program that blocks a stop signal has it blocked again after the fit (unblocked during
    it, so that the fit can stop on it); what fw's launcher blocked for the worker's start stays
    unblocked."""
    import sys as _sys

    _sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from toy import QUIET, LinearModel, loader, regression_data

    import framework as fw

    class Mask(fw.Callback):
        def on_train_start(self, trainer, module):
            self.during = signal.pthread_sigmask(signal.SIG_BLOCK, [])

    monkeypatch.setenv("FW_BLOCKED_AT_START", "SIGTERM")
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1, signal.SIGTERM])
    try:
        mask = Mask()
        fw.Trainer(**QUIET, max_epochs=1, default_root_dir=str(tmp_path), callbacks=[mask]).fit(
            LinearModel(), loader(regression_data(16), 8))
        after = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
    assert signal.SIGUSR1 not in mask.during and signal.SIGTERM not in mask.during
    assert signal.SIGUSR1 in after and signal.SIGTERM not in after
