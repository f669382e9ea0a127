"""``trainer.strategy=ft`` for real: replica groups over Gloo on this machine, meeting at a
Lighthouse on 127.0.0.1 (``fw lighthouse``, one for the module).

- no failure: both replicas end with the same parameters, bit for bit, and the same as plain
  2-rank DDP over the same global batch;
- SIGKILL of replica 1 at a random step (``FW_FT_SEED`` picks it; ``FW_FT_KILLS=10`` repeats
  with 10 steps): the survivor goes on in the same process, says the loss and the participants,
  the restarted replica takes the survivor's state at the step it joins (the hash of its weights,
  optimizer state and position equals the survivor's there), and both end identical; the
  untrained global batches are logged and in the checkpoint;
- a replica that never comes back: the survivor ends alone at max_steps;
- a head unused on one replica and BatchNorm's buffers: both replicas end with the same
  parameters and buffers (a healed one's equal its peer's at the join: the kill test's model);
  a replica alone at its start (no checkpoint) is refused;
- a replica whose commit failed takes its peer's state at its next step; a stop asked for on one
  replica stops both after the same step, even where that step's commit failed on the other;
- no Lighthouse: one line and a non-zero exit, soon; the Lighthouse killed mid-run: every
  replica exits with one line, soon, its checkpoints whole.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
REPLICA = str(HERE / "replica.py")
SLOW_HEAL = str(HERE / "slow_heal.py")  # replica.py whose download of a peer's state takes FW_FT_SLOW_HEAL s
FW = str(Path(sys.executable).parent / "fw")
MAX_STEPS = 36  # 12 global batches an epoch: the kills land in any of 3 epochs
#: how many kills the repeat test makes (FW_FT_KILLS=10 for the full count)
KILLS = int(os.environ.get("FW_FT_KILLS", "1"))
SEED = int(os.environ.get("FW_FT_SEED", str(random.randrange(1 << 16))))


def _env(**extra: str) -> dict[str, str]:
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith(("TORCHELASTIC_", "SLURM_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1", PYTHONPATH=str(REPO), **extra)
    return env


class Procs:
    """Processes a test started, each with its output in ``NAME.log``; all killed at the end."""

    def __init__(self, out: Path, lighthouse: str) -> None:
        self.out, self.lighthouse = out, lighthouse
        self.started: list[tuple[subprocess.Popen, Path]] = []

    def start(self, name: str, *args: str, script: str = REPLICA, **env: str) -> subprocess.Popen:
        path = self.out / f"{name}.log"
        with open(path, "w") as log:
            proc = subprocess.Popen([sys.executable, script, str(self.out), *args], stdout=log, stderr=subprocess.STDOUT,
                                    env=_env(TORCHFT_LIGHTHOUSE=self.lighthouse, **env), cwd=self.out,
                                    start_new_session=True)
        self.started.append((proc, path))
        return proc

    def wait(self, proc: subprocess.Popen, timeout: float) -> int:
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            log = next(path for p, path in self.started if p is proc)
            pytest.fail(f"{log.stem} still running after {timeout} s:\n{log.read_text()[-3000:]}")

    def reap(self) -> None:
        for proc, _ in self.started:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


@pytest.fixture(scope="module")
def lighthouse() -> Iterator[str]:
    """``fw lighthouse`` on a free port; a replica lost is noticed after 1.5 s without heartbeats."""
    proc = subprocess.Popen([FW, "lighthouse", "--port", "0", "--heartbeat-timeout-ms", "1500",
                             "--join-timeout-ms", "30000"], stderr=subprocess.PIPE, text=True, env=_env(),
                            start_new_session=True)
    try:
        line = proc.stderr.readline() if proc.stderr else ""  # the first line says where it listens
        found = re.search(r"Lighthouse at http://[^:]+:(\d+)", line)
        assert found, f"fw lighthouse said: {line!r}"
        yield f"http://127.0.0.1:{found.group(1)}"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(timeout=15) == 0
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture
def procs(tmp_path: Path, lighthouse: str) -> Iterator[Procs]:
    p = Procs(tmp_path, lighthouse)
    try:
        yield p
    finally:
        p.reap()


def _params(out: Path, name: str) -> dict[str, torch.Tensor]:
    return torch.load(out / f"params-{name}.pt")


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _steps(out: Path, name: str) -> dict[int, str]:
    """step -> the hash of weights, optimizer state and position at that step's start."""
    lines = (out / f"steps-{name}.txt").read_text().split("\n")
    return {int(line.split()[0]): line.split()[3] for line in lines if line}


def _log(out: Path, name: str) -> str:
    return (out / f"{name}.log").read_text()


@pytest.mark.timeout(300)
def test_two_replicas_end_identical_equal_plain_ddp_and_resume_exactly(procs: Procs, tmp_path: Path) -> None:
    r0 = procs.start("r0", "--replica", "0", "--max-steps", str(MAX_STEPS), "--every", "10")
    r1 = procs.start("r1", "--replica", "1", "--max-steps", str(MAX_STEPS), "--every", "10")
    ddp = procs.start("ddp", "--ddp", "--devices", "2", "--max-steps", str(MAX_STEPS), "--replica", "9")
    for proc, name in ((r0, "r0"), (r1, "r1"), (ddp, "ddp")):
        assert procs.wait(proc, 200) == 0, _log(tmp_path, name)
    a, b, plain = _params(tmp_path, "0-0"), _params(tmp_path, "1-0"), _params(tmp_path, "9-0")
    assert _same(a, b), "the two replicas ended with different parameters"
    assert _same(a, plain), max(float((a[k] - plain[k]).abs().max()) for k in a)  # torchft's average is DDP's, bit for bit
    assert "fw: replica 0 joined at step 0: participants 2 of 2" in _log(tmp_path, "r0")
    assert "not trained whole" not in _log(tmp_path, "r0") + _log(tmp_path, "r1")
    assert not list((tmp_path / "ckpt-1").glob("*.ckpt")), "only the replica with the lowest id writes checkpoints"
    # a full stop: both replicas resume from replica 0's checkpoint of step 20 (mid-epoch) and end as if never stopped
    ckpt = str(tmp_path / "ckpt-0" / "epoch=1-step=20.ckpt")
    resumed = [procs.start(f"resumed{r}", "--replica", str(r), "--max-steps", str(MAX_STEPS), "--ckpt-path", ckpt,
                           "--tag=-resumed") for r in (0, 1)]
    for r, proc in enumerate(resumed):
        assert procs.wait(proc, 200) == 0, _log(tmp_path, f"resumed{r}")
        assert _same(_params(tmp_path, f"{r}-0-resumed"), a), r
    assert "fw: replica 1 joined at step 20: participants 2 of 2" in _log(tmp_path, "resumed1")


def _kill_and_rejoin(procs: Procs, out: Path, kill_at: int, devices: int = 1, model: str = "mlp") -> None:
    """Replica 1 (``devices`` ranks) dies at ``kill_at``; the survivor waits 3 steps later for it
    to be restarted."""
    flag, group = f"restarted-{kill_at}", ("--devices", str(devices), "--model", model)
    batches = 96 // (4 * 2 * devices)  # global batches an epoch (replica.py: 96 samples, 4 a rank)
    r0 = procs.start("r0", "--replica", "0", "--max-steps", str(MAX_STEPS), "--every", "4",
                     "--wait-at", str(kill_at + 3), "--wait-for", flag, *group)
    r1 = procs.start("r1", "--replica", "1", "--max-steps", str(MAX_STEPS), "--kill-at", str(kill_at), "--every", "4",
                     *group)
    code = procs.wait(r1, 150)
    assert code == -signal.SIGKILL if devices == 1 else code != 0, _log(out, "r1")  # under fw's launcher: its exit
    again = procs.start("r1-again", "--replica", "1", "--max-steps", str(MAX_STEPS), "--tag=-again",
                        "--announce", flag, "--every", "4", *group)
    assert procs.wait(again, 150) == 0, _log(out, "r1-again")
    assert procs.wait(r0, 150) == 0, _log(out, "r0")  # the same process(es) from the first step to the last
    survivor, healed = _log(out, "r0"), _log(out, "r1-again")
    lost = re.findall(r"fw: replica 1 lost at step (\d+) .*: participants 2 -> 1", survivor)
    assert len(lost) == 1 and int(lost[0]) in (kill_at, kill_at + 1), survivor  # +1: the step under way not committed
    joined = re.search(r"fw: replica 1 healed from the state of replica 0 \(a live peer\) at step (\d+)", healed)
    assert joined, healed
    step = int(joined.group(1))
    assert "fw: replica 1 joined at step" in survivor and "participants 1 -> 2" in survivor, survivor
    # the healed replica's state at the step it joined is the survivor's, bit for bit (each rank's)
    for rank in range(devices):
        mine, peer = _steps(out, f"1-{rank}-again"), _steps(out, f"0-{rank}")
        assert min(mine) == step and mine[step] == peer[step], (rank, step, mine.get(step), peer.get(step))
        assert _same(_params(out, f"0-{rank}"), _params(out, f"1-{rank}-again")), rank
    # the untrained global batches: in the survivor's last line and in its checkpoints
    checkpoints = sorted((out / "ckpt-0").glob("*.ckpt"), key=lambda p: p.stat().st_mtime)
    ledger = torch.load(checkpoints[-1], weights_only=False)["fault_tolerance"]
    untrained = sum(e["last"] - e["first"] + 1 for e in ledger["untrained"])
    assert untrained == ledger["untrained_batches"] == step - kill_at, ledger
    first = ledger["untrained"][0]
    assert (first["epoch"], first["first"]) == divmod(kill_at, batches) and "1" in first["missing"], ledger
    assert f"{untrained} global batches" in survivor, survivor
    assert not list((out / "ckpt-1").glob("*.ckpt")), "only the replica with the lowest id writes checkpoints"


@pytest.mark.timeout(300 * KILLS)
def test_a_killed_replica_rejoins_healed_from_its_peer(procs: Procs, tmp_path: Path) -> None:
    rng = random.Random(SEED)
    for n in range(KILLS):
        kill_at = rng.randrange(2, MAX_STEPS - 12)
        print(f"FW_FT_SEED={SEED}: kill {n + 1} of {KILLS}: replica 1 at step {kill_at}")
        out = tmp_path / f"kill{n}"
        out.mkdir()
        procs.out = out
        _kill_and_rejoin(procs, out, kill_at, model="routed")  # BatchNorm: its buffers change in the forward


@pytest.mark.timeout(400)
def test_groups_of_two_ranks_ddp_inside_survive_a_kill(procs: Procs, tmp_path: Path) -> None:
    kill_at = random.Random(SEED + 2).randrange(2, MAX_STEPS - 12)
    print(f"FW_FT_SEED={SEED}: 2 groups x 2 ranks, replica 1 killed at step {kill_at}")
    _kill_and_rejoin(procs, tmp_path, kill_at, devices=2)


@pytest.mark.timeout(200)
def test_a_replica_that_could_not_commit_takes_its_peers_state_in_place_and_a_stop_asked_on_one_stops_both(
        procs: Procs, tmp_path: Path) -> None:
    """Replica 1's commit of a step fails while replica 0's succeeds: it takes replica 0's state at
    its next step. Later replica 1 alone asks to stop (``trainer.should_stop`` after step S, as
    EarlyStopping on its own training metric would); the replicas agree on it at step S+1's
    commit, which fails on replica 0 alone: both stop after step S+1, and replica 0 takes replica
    1's state at the last quorum, whose download takes 3 s there: replica 1 waits for it (it left at
    once before, and replica 0 ended a step behind with exit 0)."""
    step = random.Random(SEED + 3).randrange(2, MAX_STEPS - 8)
    stop = step + 3
    print(f"FW_FT_SEED={SEED}: replica 1's commit of step {step} fails; replica 1 asks to stop after step {stop}, "
          f"and replica 0's commit of step {stop + 1} fails")
    r0 = procs.start("r0", "--replica", "0", "--max-steps", str(MAX_STEPS), "--fail-commit-at", str(stop),
                     script=SLOW_HEAL, FW_FT_SLOW_HEAL="3")
    r1 = procs.start("r1", "--replica", "1", "--max-steps", str(MAX_STEPS), "--fail-commit-at", str(step),
                     "--stop-at", str(stop))
    for proc, name in ((r0, "r0"), (r1, "r1")):
        assert procs.wait(proc, 150) == 0, _log(tmp_path, name)
    behind = _log(tmp_path, "r1")
    assert f"fw: replica 1 took a peer's weights and optimizer state at step {step + 1}" in behind, behind
    mine, peer = _steps(tmp_path, "1-0"), _steps(tmp_path, "0-0")
    assert mine[step] == peer[step]  # the same state until then
    assert mine[step + 1] != peer[step + 1]  # the peer applied the step, this replica did not
    assert mine[step + 2] == peer[step + 2], "after the heal the two replicas train the same state"
    # the stop: after the same step on both, and the replica that could not commit it caught up
    for r in (0, 1):
        assert f"replica {r} done at step {stop + 1}" in _log(tmp_path, f"r{r}"), _log(tmp_path, f"r{r}")
        assert max(_steps(tmp_path, f"{r}-0")) == stop
    assert f"fw: replica 0 took a peer's weights and optimizer state at step {stop + 1}" in _log(tmp_path, "r0")
    assert _same(_params(tmp_path, "0-0"), _params(tmp_path, "1-0"))
    assert "not trained whole" not in _log(tmp_path, "r0") + behind  # the peer's step had both shares


@pytest.mark.timeout(200)
def test_a_replica_that_never_comes_back(procs: Procs, tmp_path: Path) -> None:
    kill_at = random.Random(SEED + 1).randrange(2, MAX_STEPS - 4)
    print(f"FW_FT_SEED={SEED}: replica 1 killed at step {kill_at}, not restarted")
    r0 = procs.start("r0", "--replica", "0", "--max-steps", str(MAX_STEPS))
    r1 = procs.start("r1", "--replica", "1", "--max-steps", str(MAX_STEPS), "--kill-at", str(kill_at))
    assert procs.wait(r1, 150) == -signal.SIGKILL
    assert procs.wait(r0, 150) == 0, _log(tmp_path, "r0")
    survivor = _log(tmp_path, "r0")
    assert "fw fit: done at step 36, max_steps=36 reached" in survivor, survivor
    assert re.search(r"fw: replica 1 lost at step \d+ .*: participants 2 -> 1", survivor), survivor
    assert f"fw: replica 0: {MAX_STEPS - kill_at} global batches" in survivor, survivor


@pytest.mark.timeout(120)
def test_no_lighthouse_is_one_line_and_a_non_zero_exit(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    recipe = tmp_path / "ft.yaml"
    recipe.write_text(f"""
seed: 0
logger: false
module:
  _target_: replica.Net
trainer:
  max_steps: 3
  accelerator: cpu
  enable_checkpointing: false
  default_root_dir: {tmp_path}
  strategy: {{name: ft, replica_id: 0, num_replica_groups: 2, lighthouse: "http://127.0.0.1:{port}", lighthouse_wait: 2}}
""")
    start = time.monotonic()
    done = subprocess.run([FW, "fit", str(recipe)], capture_output=True, text=True, timeout=100, env=_env(),
                          cwd=HERE)
    took = time.monotonic() - start
    assert done.returncode == 1, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("fw: error:")]
    assert errors == [f"fw: error: no Lighthouse answers at http://127.0.0.1:{port} (Connection refused): start one "
                      f"first (`fw lighthouse --min-replicas 1 --port {port}`) or name the right one with "
                      "trainer.strategy.lighthouse=http://HOST:PORT"], done.stderr
    assert "Traceback" not in done.stderr
    assert took < 60, took


def _start_lighthouse() -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([FW, "lighthouse", "--port", "0", "--heartbeat-timeout-ms", "1500", "--join-timeout-ms",
                             "30000"], stderr=subprocess.PIPE, text=True, env=_env(), start_new_session=True)
    line = proc.stderr.readline() if proc.stderr else ""
    found = re.search(r"Lighthouse at http://[^:]+:(\d+)", line)
    assert found, f"fw lighthouse said: {line!r}"
    return proc, f"http://127.0.0.1:{found.group(1)}"


@pytest.mark.timeout(150)
def test_the_lighthouse_lost_mid_run_stops_every_replica_with_one_line_and_keeps_its_checkpoints(tmp_path: Path) -> None:
    """The Lighthouse is the job's single point of failure: killed in the middle of the run, every
    replica exits non-zero soon, with one line naming it, and the checkpoints written before are
    whole (no temporary file left)."""
    from framework.checkpointing.file import load_checkpoint

    lighthouse, address = _start_lighthouse()
    started: list[subprocess.Popen] = []
    try:
        for r in (0, 1):
            recipe = tmp_path / f"ft{r}.yaml"
            recipe.write_text(f"""
seed: 0
logger: false
module:
  _target_: replica.Net
callbacks:
  - _target_: framework.callbacks.ModelCheckpoint
    dirpath: {tmp_path}/ckpt-{r}
    every_n_train_steps: 4
    save_top_k: -1
trainer:
  max_steps: 100000
  accelerator: cpu
  enable_progress_bar: false
  default_root_dir: {tmp_path}/root-{r}
  strategy: {{name: ft, replica_id: {r}, num_replica_groups: 2, lighthouse: "{address}", quorum_timeout: 10}}
""")
            with open(tmp_path / f"r{r}.log", "w") as log:
                started.append(subprocess.Popen([FW, "fit", str(recipe)], stdout=log, stderr=subprocess.STDOUT,
                                                env=_env(), cwd=HERE, start_new_session=True))
        deadline = time.monotonic() + 90
        while not list((tmp_path / "ckpt-0").glob("*step=8.ckpt")) and time.monotonic() < deadline:
            assert all(p.poll() is None for p in started), _log(tmp_path, "r0") + _log(tmp_path, "r1")
            time.sleep(0.05)
        lighthouse.kill()
        killed = time.monotonic()
        codes = [p.wait(timeout=90) for p in started]
        took = time.monotonic() - killed
    finally:
        for p in [*started, lighthouse]:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=10)
    for r, code in enumerate(codes):
        log = _log(tmp_path, f"r{r}")
        errors = [line for line in log.splitlines() if line.startswith("fw: error:")]
        assert code == 1 and len(errors) == 1 and "Traceback" not in log, log
        assert errors[0].startswith(f"fw: error: replica {r} got no quorum from the Lighthouse at {address} "), log
    print(f"both replicas exited {took:.1f} s after the Lighthouse was killed")
    assert took < 60, took
    saved = sorted((tmp_path / "ckpt-0").glob("*.ckpt"))
    assert saved and not list((tmp_path / "ckpt-0").glob(".*.tmp")), sorted((tmp_path / "ckpt-0").iterdir())
    assert all(load_checkpoint(path)["global_step"] % 4 == 0 for path in saved)


@pytest.mark.timeout(200)
def test_unused_heads_and_batchnorm_buffers_end_identical_and_a_lone_replica_is_refused(procs: Procs,
                                                                                        tmp_path: Path) -> None:
    """Each step's head is chosen by the replica's own first sample (a head unused on one replica
    gets its gradient only from the other), and BatchNorm's running statistics come from each
    replica's own share: both replicas end with the same parameters and buffers. Then a replica
    that finds no other at its start (and has no checkpoint) is refused after its start's wait."""
    steps = "12"
    r0 = procs.start("r0", "--replica", "0", "--max-steps", steps, "--model", "routed")
    r1 = procs.start("r1", "--replica", "1", "--max-steps", steps, "--model", "routed")
    for proc, name in ((r0, "r0"), (r1, "r1")):
        assert procs.wait(proc, 150) == 0, _log(tmp_path, name)
    a, b = _params(tmp_path, "0-0"), _params(tmp_path, "1-0")
    assert any("running_mean" in k for k in a) and _same(a, b), {k: float((a[k] - b[k]).abs().max()) for k in a}
    alone = procs.start("alone", "--replica", "1", "--max-steps", steps, "--timeout", "2")
    assert procs.wait(alone, 60) != 0
    assert ("replica 1 found no other replica group at the Lighthouse within 2 s (trainer.strategy.timeout) and has "
            "no checkpoint: it would train a model of its own; start the other groups with it, or set "
            "trainer.strategy.start_alone=true to let it begin alone") in _log(tmp_path, "alone")
