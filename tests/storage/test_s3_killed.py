"""Jobs killed while they write to an S3 bucket (moto's server on 127.0.0.1), and what their
restarts find there.

- A sharded (FSDP/DCP) checkpoint: 2 FSDP ranks over Gloo save every 10 steps to
  ``s3://bucket/ck``; rank 1 is SIGKILLed right after DCP wrote the step-20 folder's shards and
  ``.metadata``, before fw's ``fw_state.pt`` and ``COMMITTED``. That folder is in the bucket but
  never loaded nor chosen: ``ckpt_path="last"`` resumes the step-10 one, bit for bit against a run
  never stopped, and the resumed run, which removes that folder first, writes it whole.
- An elastic restart: 2 DDP ranks (Gloo) under fw's launcher with ``max_restarts=1`` save every
  4 steps into the bucket; one rank is SIGKILLed mid-epoch (step 11), the agent restarts the group, and the
  restarted workers resume from the newest checkpoint of this job that the bucket holds (no
  ckpt_path) and end bit-identical to a run that was never stopped.
"""

from __future__ import annotations

import io
import json

import forked
import pytest
import torch
from distributed.helpers import check_ok, run_script, write_script

from framework.checkpointing.file import read_values
from framework.errors import CheckpointError

pytestmark = pytest.mark.procs  # a server process per module (conftest.py), forked ranks

KILLED_IN_SAVE = """
import os, signal, sys
import torch
import torch.distributed.checkpoint as dcp
import framework as fw
from framework.callbacks import ModelCheckpoint
import sharded

out, url, mode = sys.argv[1], sys.argv[2], sys.argv[3]
strategy = {"name": "fsdp", "auto_wrap_policy": ["Block"]}
write_shards = dcp.save


def save_then_die(state, **kwargs):  # rank 1 dies right after DCP wrote the step-20 folder
    write_shards(state, **kwargs)
    if "step=20" in str(kwargs["storage_writer"].path) and os.environ["RANK"] == "1":
        os.kill(os.getpid(), signal.SIGKILL)


class Started(fw.Callback):  # where the resumed fit starts from: rank 0 notes it
    def on_train_start(self, trainer, module):
        if trainer.global_rank == 0:
            with open(out + "/started.txt", "w") as f:
                f.write(f"{trainer.ckpt_path} {trainer.global_step}")


if mode == "kill":
    dcp.save = save_then_die
every_10 = lambda: [ModelCheckpoint(dirpath=url, every_n_train_steps=10, save_top_k=-1), Started()]
common = dict(devices=2, max_steps=30, samples=480, shuffle=True)
if mode == "kill":
    sharded.fit(strategy, callbacks=every_10(), root=out, **common)
else:
    resumed = sharded.fit(strategy, callbacks=every_10(), root=out, ckpt_path="last", **common)
    straight = sharded.fit(strategy, root=out, **common)
    if resumed["rank"] == 0:
        torch.save({"resumed": resumed, "straight": straight}, out + "/after_kill.pt")
"""


@pytest.mark.timeout(240)
def test_a_rank_killed_in_a_sharded_save_to_the_bucket_leaves_a_folder_never_chosen(s3, bucket, tmp_path):
    script = write_script(tmp_path, KILLED_IN_SAVE)
    url = f"s3://{bucket}/ck"
    killed = forked.run_script(script, str(tmp_path), url, "kill", nprocs=2, timeout=100)
    assert killed.returncode != 0, killed.output
    fs = s3.filesystem()
    step_20 = f"{bucket}/ck/epoch=0-step=20.ckpt"
    written = {key.removeprefix(step_20 + "/") for key in fs.find(step_20)}
    assert {".metadata", "__1_0.distcp"} <= written and "COMMITTED" not in written, written
    assert fs.exists(f"{bucket}/ck/epoch=0-step=10.ckpt/COMMITTED")
    with pytest.raises(CheckpointError, match=r"is incomplete \(no COMMITTED mark"):
        read_values(f"s3://{step_20}")

    resumed = forked.run_script(script, str(tmp_path), url, "resume", nprocs=2, timeout=100)
    check_ok(resumed)
    assert (tmp_path / "started.txt").read_text() == f"{url}/epoch=0-step=10.ckpt 10"
    fs.invalidate_cache()
    assert fs.exists(f"{step_20}/COMMITTED") and fs.exists(f"{bucket}/ck/epoch=0-step=30.ckpt/COMMITTED")
    runs = torch.load(tmp_path / "after_kill.pt")
    assert runs["resumed"]["global_step"] == runs["straight"]["global_step"] == 30
    for name, tensor in runs["straight"]["weights"].items():
        assert torch.equal(runs["resumed"]["weights"][name], tensor), name
    saved = torch.load(io.BytesIO(fs.cat_file(f"{bucket}/ck/epoch=0-step=30.ckpt/fw_state.pt")), weights_only=True)
    assert saved["global_step"] == 30


RESTARTED = """
import json, os, signal, sys
from torch.utils.data import DataLoader
import torch
import framework as fw
from framework.callbacks import ModelCheckpoint
import workload

out, root, name, kill_step = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])

class KillOnce(fw.Callback):
    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        if first_attempt and trainer.global_rank == 1 and trainer.global_step == kill_step:
            os.kill(os.getpid(), signal.SIGKILL)

fw.seed_everything(0)
model = workload.Regressor()
trainer = fw.Trainer(devices=2, strategy="ddp_gloo", max_epochs=2, accelerator="cpu", logger=False,
                     enable_progress_bar=False, num_sanity_val_steps=0, default_root_dir=f"{root}/{name}",
                     max_restarts=1 if name != "straight" else 0,
                     callbacks=[KillOnce(), ModelCheckpoint(every_n_train_steps=4, save_top_k=-1)])
trainer.fit(model, DataLoader(workload.regression_data(64), batch_size=4, shuffle=True))
with open(f"{out}/{name}_rank{trainer.global_rank}.json", "w") as f:
    json.dump({"step": trainer.global_step, "w": torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()}, f)
"""


@pytest.mark.timeout(180)
def test_a_restarted_job_resumes_from_its_newest_checkpoint_in_the_bucket(s3, bucket, tmp_path):
    script = write_script(tmp_path, RESTARTED)
    root = f"s3://{bucket}"
    check_ok(forked.run_script(script, str(tmp_path), root, "straight", "-1", nprocs=2, timeout=60))
    result = run_script(script, str(tmp_path), root, "killed", "11", timeout=120)
    check_ok(result)
    assert "workers restarted by the elastic agent (restart 1): resuming from s3://" in result.output, result.output
    for rank in (0, 1):
        got = json.loads((tmp_path / f"killed_rank{rank}.json").read_text())
        want = json.loads((tmp_path / f"straight_rank{rank}.json").read_text())
        assert got["step"] == want["step"] == 16 and got["w"] == want["w"], f"rank {rank}"
    assert not list(tmp_path.glob("s3*"))
