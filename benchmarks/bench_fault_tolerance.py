"""What per-step fault tolerance (``trainer.strategy=ft``, torchft) costs a step with no failure, and how soon training goes on after a lost process, against fw's restart path.

Why: ``ft`` adds a quorum at the Lighthouse and a second all-reduce to every step, to spare the
survivors of a loss the restart from the last checkpoint; both sides of that trade are measured.
Read: the step table (median step, 2 processes either way: plain DDP over 2 ranks, and 2 replica
groups of 1 rank under ``ft``); the failure table: seconds from the SIGKILL of one process to the
step the survivors begin after it ends (``ft``: the survivor, with the Lighthouse's heartbeat timeout at
5 s, torchft's default, and at 1 s), and to the first step of the job restarted by fw's launcher
(``max_restarts=1``) from its last checkpoint, with the steps it trains again.
Time: about 7 minutes on 2 cores (3 rounds); ``--quick`` about 2.5 minutes; ``--no-failure`` (the
step table alone) about 3 minutes.
Run: ``python benchmarks/run.py fault_tolerance [--quick] [--no-failure]``.

Every job is a fresh ``Trainer.fit`` in its own processes (fw's launcher for DDP, one process
per replica group for ``ft``, a ``fw lighthouse`` for the Lighthouse), side by side in rounds
that alternate the order. A callback records the wall clock at each batch's end; the killed
process writes the moment it kills itself.

    .venv/bin/python benchmarks/bench_fault_tolerance.py            # ~7 minutes on 2 cores
    .venv/bin/python benchmarks/bench_fault_tolerance.py --quick
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from framework.bench.common import machine_info, median, print_table, result_path, write_json

ROOT = Path(__file__).resolve().parents[1]
FW = str(Path(sys.executable).parent / "fw")

JOB = """
import json, os, signal, sys, time, torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
import framework as fw

out, mode, replica, steps, kill_at, every = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), \\
    int(sys.argv[5]), int(sys.argv[6])
first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"

class Net(fw.TrainModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1))
    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)

class Clock(fw.Callback):
    def __init__(self):
        self.starts, self.ends, self.first = [], [], None
    def on_train_start(self, trainer, module):
        self.first = trainer.global_step
    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.starts.append(time.time())
        dying = replica == 1 if mode == "ft" else trainer.global_rank == 1 and first_attempt
        if kill_at >= 0 and dying and trainer.global_step == kill_at:
            with open(os.path.join(out, "killed"), "w") as f:
                f.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.ends.append(time.time())

clock = Clock()
g = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(8192, 256, generator=g), torch.randn(8192, 1, generator=g))
if mode == "ft":
    strategy = {"name": "ft", "replica_id": replica, "num_replica_groups": 2, "lighthouse": os.environ["LIGHTHOUSE"]}
    devices = 1
else:
    strategy, devices = "ddp_gloo", 2
callbacks = [clock]
if every:
    callbacks.append(fw.callbacks.ModelCheckpoint(dirpath=os.path.join(out, "ckpt"), every_n_train_steps=every,
                                                  save_top_k=-1))
trainer = fw.Trainer(accelerator="cpu", devices=devices, strategy=strategy, max_steps=steps, logger=False,
                     enable_checkpointing=bool(every), enable_progress_bar=False, enable_model_summary=False,
                     callbacks=callbacks, max_restarts=1 if mode == "ddp" and kill_at >= 0 else 0,
                     default_root_dir=os.path.join(out, f"root{replica}"))
trainer.fit(Net(), DataLoader(data, batch_size=32, shuffle=True))
if trainer.global_rank == 0:
    with open(os.path.join(out, f"clock-{mode}-{replica}.json"), "w") as f:
        json.dump({"starts": clock.starts, "ends": clock.ends, "first_step": clock.first}, f)
"""


def env(**extra: str) -> dict[str, str]:
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    out = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("TORCHELASTIC_")}
    out.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), **extra)
    return out


class Lighthouse:
    """``fw lighthouse`` on a free port, with the given heartbeat timeout."""

    def __init__(self, heartbeat_ms: int) -> None:
        self.proc = subprocess.Popen([FW, "lighthouse", "--port", "0", "--heartbeat-timeout-ms", str(heartbeat_ms)],
                                     stderr=subprocess.PIPE, text=True, env=env(), start_new_session=True)
        line = self.proc.stderr.readline() if self.proc.stderr else ""
        found = re.search(r"Lighthouse at http://[^:]+:(\d+)", line)
        if not found:
            self.close()
            raise SystemExit(f"fw lighthouse did not start: {line!r}")
        self.address = f"http://127.0.0.1:{found.group(1)}"

    def close(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def run_jobs(commands: list[list[str]], extra_env: dict[str, str], timeout: float) -> None:
    procs = [subprocess.Popen(cmd, env=env(**extra_env), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True, start_new_session=True) for cmd in commands]
    try:
        for proc in procs:
            _, err = proc.communicate(timeout=timeout)
            if proc.returncode not in (0, -signal.SIGKILL):
                raise SystemExit(f"{proc.args[2:]} failed ({proc.returncode}):\n{err[-2000:]}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def step_times(ends: list[float], skip: int) -> list[float]:
    """Seconds per step between batch ends, the first ``skip`` left out (warm-up)."""
    return [b - a for a, b in zip(ends[skip:], ends[skip + 1:], strict=False)]


def no_failure_round(job: Path, work: Path, steps: int, lighthouse: Lighthouse, order: list[str]) -> dict[str, float]:
    """One DDP fit and one ``ft`` fit (2 replicas), in ``order``: the median step of each."""
    found = {}
    for mode in order:
        out = Path(tempfile.mkdtemp(dir=work))
        if mode == "ddp":
            run_jobs([[sys.executable, str(job), str(out), "ddp", "0", str(steps), "-1", "0"]], {}, 600)
        else:
            run_jobs([[sys.executable, str(job), str(out), "ft", str(r), str(steps), "-1", "0"] for r in (0, 1)],
                     {"LIGHTHOUSE": lighthouse.address}, 600)
        clock = json.loads((out / f"clock-{mode}-0.json").read_text())
        found[mode] = median(step_times(clock["ends"], skip=10))
    return found


def failure_ft(job: Path, work: Path, steps: int, kill_at: int, lighthouse: Lighthouse) -> dict[str, float]:
    """Kill replica 1 at ``kill_at``: seconds from the kill to the end of the survivor's first step
    begun after it (a step already under way when the peer died may end at once, or wait too)."""
    out = Path(tempfile.mkdtemp(dir=work))
    run_jobs([[sys.executable, str(job), str(out), "ft", str(r), str(steps), str(kill_at), "0"] for r in (0, 1)],
             {"LIGHTHOUSE": lighthouse.address}, 600)
    killed = float((out / "killed").read_text())
    clock = json.loads((out / "clock-ft-0.json").read_text())
    steps_after = [end - killed for start, end in zip(clock["starts"], clock["ends"], strict=False) if start > killed]
    in_flight = [end - killed for start, end in zip(clock["starts"], clock["ends"], strict=False)
                 if start <= killed < end]
    return {"next_step_s": steps_after[0], "step_under_way_s": in_flight[0] if in_flight else 0.0}


def failure_restart(job: Path, work: Path, steps: int, kill_at: int, every: int) -> dict[str, float]:
    """Kill rank 1 of a 2-rank DDP job at ``kill_at`` under fw's launcher with ``max_restarts=1``:
    seconds from the kill to the restarted job's first finished step, and the steps trained again."""
    out = Path(tempfile.mkdtemp(dir=work))
    run_jobs([[sys.executable, str(job), str(out), "ddp", "0", str(steps), str(kill_at), str(every)]], {}, 600)
    killed = float((out / "killed").read_text())
    clock = json.loads((out / "clock-ddp-0.json").read_text())
    return {"next_step_s": clock["ends"][0] - killed, "steps_again": kill_at - clock["first_step"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps and rounds (about a minute)")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--no-failure", action="store_true", help="the step with no failure alone (no kills)")
    parser.add_argument("--out", default=None, help="the JSON results file (default: benchmarks/results/...)")
    args = parser.parse_args()
    rounds = args.rounds or (1 if args.quick else 3)
    steps, kill_at, every = (60, 30, 20) if args.quick else (200, 90, 50)
    results: dict = {"machine": machine_info(), "steps": steps, "kill_at": kill_at, "checkpoint_every": every,
                     "rounds": rounds, "step_s": {"ddp": [], "ft": []}, "failure": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        job = work / "job.py"
        job.write_text(JOB)
        lighthouse = Lighthouse(5000)
        quick_lighthouse = Lighthouse(1000)
        try:
            for r in range(rounds):
                order = ["ddp", "ft"] if r % 2 == 0 else ["ft", "ddp"]
                for mode, step in no_failure_round(job, work, steps, lighthouse, order).items():
                    results["step_s"][mode].append(step)
                if args.no_failure:
                    print(f"round {r + 1} of {rounds}: ddp {results['step_s']['ddp'][-1] * 1e3:.2f} ms, "
                          f"ft {results['step_s']['ft'][-1] * 1e3:.2f} ms", flush=True)
                    continue
                results["failure"].append({
                    "ft_heartbeat_5s": failure_ft(job, work, steps, kill_at, lighthouse),
                    "ft_heartbeat_1s": failure_ft(job, work, steps, kill_at, quick_lighthouse),
                    "restart": failure_restart(job, work, steps, kill_at, every),
                })
                print(f"round {r + 1} of {rounds}: {json.dumps(results['failure'][-1])}", flush=True)
        finally:
            lighthouse.close()
            quick_lighthouse.close()
    ddp, ft = median(results["step_s"]["ddp"]), median(results["step_s"]["ft"])
    print_table("A step with no failure (2 processes either way)", ["job", "median step", "vs ddp"],
                [["ddp_gloo, 2 ranks", f"{ddp * 1e3:.2f} ms", "1.00x"],
                 ["ft, 2 replica groups x 1 rank", f"{ft * 1e3:.2f} ms", f"{ft / ddp:.2f}x"]])
    rows = []
    for key, name in [] if args.no_failure else (("ft_heartbeat_5s", "ft, Lighthouse heartbeat timeout 5 s"),
                      ("ft_heartbeat_1s", "ft, Lighthouse heartbeat timeout 1 s"),
                      ("restart", f"restart (max_restarts=1, checkpoint every {every} steps)")):
        runs = [f[key] for f in results["failure"]]
        again = f"{median([x['steps_again'] for x in runs]):.0f}" if key == "restart" else "0"
        rows.append([name, f"{median([x['next_step_s'] for x in runs]):.2f} s", again])
    if rows:
        print_table("kill -9 of one process", ["after the kill", "to the next finished step", "steps trained again"],
                    rows)
    path = Path(args.out) if args.out else result_path("fault_tolerance_steps" if args.no_failure else "fault_tolerance")
    write_json(path, results)
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
