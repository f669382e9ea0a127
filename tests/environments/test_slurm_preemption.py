"""Preemption on a real SLURM cluster: ``sbatch --signal=USR1@50 --requeue`` sends the job's
task SIGUSR1 ahead of its time limit; fw stops after its step, writes a checkpoint and requeues
the job (``trainer.requeue=true``); the requeued job resumes on its own from that checkpoint and
ends bit-identical to a run never stopped. Slurm's shortest time limit is a minute and it may
signal up to a minute early, so this test takes 1-3 minutes. The early signal may also reach a
requeued attempt (seen on a loaded machine: while it still imported torch): it stops, checkpoints
and requeues again, and the job still ends where the run never stopped ends."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import subprocess_env

from .test_slurm_cluster import job_field, needs_slurm, show_job, slurm_cluster  # noqa: F401 (the fixture needs_slurm asks for)

pytestmark = pytest.mark.slurm

SCRIPT = textwrap.dedent(
    """
    import signal
    # Slurm may send the signal up to a minute early, here while Python still imports torch:
    # held back until fw's fit handles it
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    import json, os, sys, time
    import torch, torch.nn.functional as F
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset
    import framework as fw

    out, name = sys.argv[1], sys.argv[2]
    first_attempt = name == "job" and not int(os.environ.get("SLURM_RESTART_COUNT") or 0)

    class Net(fw.TrainModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 1))
        def training_step(self, batch, batch_idx):
            if first_attempt:
                time.sleep(0.25)  # slow enough that the signal comes before the end
            x, y = batch
            return F.mse_loss(self.net(x), y)
        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=0.01)

    torch.set_num_threads(1)
    fw.seed_everything(0)
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(400, 4, generator=g), torch.randn(400, 1, generator=g))
    model = Net()
    trainer = fw.Trainer(accelerator="cpu", devices=1, max_epochs=3, logger=False, enable_progress_bar=False,
                         num_sanity_val_steps=0, default_root_dir=f"{out}/{name}", requeue=True)
    trainer.fit(model, DataLoader(data, batch_size=4, shuffle=True))
    with open(f"{out}/{name}.json", "w") as f:
        json.dump({"step": trainer.global_step, "restarts": os.environ.get("SLURM_RESTART_COUNT"),
                   "w": [p.detach().flatten().tolist() for p in model.parameters()]}, f)
    """
)


def _node_idle() -> bool:
    done = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=20)
    return done.stdout.split() == ["idle"]


@needs_slurm
@pytest.mark.timeout(330)
def test_sbatch_signal_stops_checkpoints_requeues_and_resumes_exactly(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    straight = subprocess.run([sys.executable, str(script), str(tmp_path), "straight"], env=subprocess_env(),
                              capture_output=True, text=True, timeout=120)
    assert straight.returncode == 0, straight.stdout + straight.stderr
    batch = tmp_path / "job.sh"
    batch.write_text(
        "#!/bin/bash\n#SBATCH --time=1\n#SBATCH --signal=USR1@50\n#SBATCH --requeue\n"
        f"#SBATCH --open-mode=append\n#SBATCH --output={tmp_path}/slurm.out\n"
        f"srun -n1 {sys.executable} {script} {tmp_path} job\n"
    )
    submitted = subprocess.run(["sbatch", "--parsable", str(batch)], env=subprocess_env(), capture_output=True,
                               text=True, timeout=30)
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    try:
        end, hurried = time.monotonic() + 300, set()
        while not (tmp_path / "job.json").exists() and time.monotonic() < end:
            shown = show_job(job)
            restarts = re.search(r"Restarts=(\d+)", shown)
            if restarts and int(restarts[1]) not in hurried | {0} and job_field(shown, "JobState") == "PENDING" \
                    and _node_idle():
                # Slurm holds a requeued job for 2 minutes; the test need not wait that long, but
                # the attempt before must be cleaned up first ("Job credential revoked" otherwise)
                time.sleep(3)
                subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], capture_output=True, timeout=20)
                hurried.add(int(restarts[1]))
            time.sleep(1)
        log = (tmp_path / "slurm.out").read_text() if (tmp_path / "slurm.out").exists() else ""
        state = job_field(show_job(job), "JobState")
        assert (tmp_path / "job.json").exists(), f"job {job} ({state}) did not finish:\n{log}"
    finally:
        subprocess.run(["scancel", job], capture_output=True, timeout=20)
    assert "fw: rank 0 received SIGUSR1: stopping after this step" in log, log
    assert f"SLURM job {job} requeued" in log, log
    assert f"fw: SLURM job {job} requeued (restart 1): resuming from" in log, log
    result = json.loads((tmp_path / "job.json").read_text())
    reference = json.loads((tmp_path / "straight.json").read_text())
    assert int(result["restarts"]) >= 1 and result["step"] == reference["step"] == 300
    assert result["w"] == reference["w"]
