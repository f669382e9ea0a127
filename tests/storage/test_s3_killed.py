"""Jobs killed while they write to an S3 bucket (moto's server on 127.0.0.1), and what their
restarts find there.

- A sharded (FSDP/DCP) checkpoint: 2 FSDP ranks over Gloo save every 2 steps to
  ``s3://bucket/ck``; rank 1 is SIGKILLed right after DCP wrote the step-4 folder's shards and
  ``.metadata``, before fw's ``fw_state.pt`` and ``COMMITTED``. That folder is in the bucket but
  never loaded nor chosen: ``ckpt_path="last"`` resumes the step-2 one, bit for bit against a run
  never stopped, and the resumed run, which removes that folder first, writes it whole.
- An elastic restart: 2 DDP ranks (Gloo) under fw's launcher with ``max_restarts=1`` save every
  4 steps into the bucket; one rank is SIGKILLed mid-epoch (step 11), the agent restarts the group, and the
  restarted workers resume from the newest checkpoint of this job that the bucket holds (no
  ckpt_path) and end bit-identical to a run that was never stopped.
- A single-file checkpoint: a fit saving every 2 steps to ``s3://bucket/<case>/ck`` is SIGKILLed
  while the upload of a 12 MiB checkpoint is in flight: its parts are on the server, the
  multipart upload not completed (s3fs uploads a file of 100 MiB or more in parts; the script
  lowers the part size to 5 MiB, S3's smallest, so that a small checkpoint takes the same path,
  and dies just before the completing call). Uploaded in the save and in the background
  (``async_upload``): no object under that name, the index does not name it, and a restart with
  ``ckpt_path="last"`` resumes from the checkpoint before it (or starts fresh when it was the
  first) and ends bit for bit as the run never stopped.
"""

from __future__ import annotations

import io
import json
import signal

import forked
import pytest
import torch
from distributed.helpers import check_ok, run_script, write_script

from framework.checkpointing.file import read_values
from framework.errors import CheckpointError

pytestmark = pytest.mark.procs  # the server process (conftest.py), forked ranks

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


def save_then_die(state, **kwargs):  # rank 1 dies right after DCP wrote the step-4 folder
    write_shards(state, **kwargs)
    if "step=4" in str(kwargs["storage_writer"].path) and os.environ["RANK"] == "1":
        os.kill(os.getpid(), signal.SIGKILL)


class Started(fw.Callback):  # where the resumed fit starts from: rank 0 notes it
    def on_train_start(self, trainer, module):
        if trainer.global_rank == 0:
            with open(out + "/started.txt", "w") as f:
                f.write(f"{trainer.ckpt_path} {trainer.global_step}")


if mode == "kill":
    dcp.save = save_then_die
every_2 = lambda: [ModelCheckpoint(dirpath=url, every_n_train_steps=2, save_top_k=-1), Started()]
common = dict(devices=2, max_steps=6, samples=96, shuffle=True)
if mode == "kill":
    sharded.fit(strategy, callbacks=every_2(), root=out, **common)
else:
    resumed = sharded.fit(strategy, callbacks=every_2(), root=out, ckpt_path="last", **common)
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
    step_4 = f"{bucket}/ck/epoch=0-step=4.ckpt"
    written = {key.removeprefix(step_4 + "/") for key in fs.find(step_4)}
    assert {".metadata", "__1_0.distcp"} <= written and "COMMITTED" not in written, written
    assert fs.exists(f"{bucket}/ck/epoch=0-step=2.ckpt/COMMITTED")
    with pytest.raises(CheckpointError, match=r"is incomplete \(no COMMITTED mark"):
        read_values(f"s3://{step_4}")

    resumed = forked.run_script(script, str(tmp_path), url, "resume", nprocs=2, timeout=100)
    check_ok(resumed)
    assert (tmp_path / "started.txt").read_text() == f"{url}/epoch=0-step=2.ckpt 2"
    fs.invalidate_cache()
    assert fs.exists(f"{step_4}/COMMITTED") and fs.exists(f"{bucket}/ck/epoch=0-step=6.ckpt/COMMITTED")
    runs = torch.load(tmp_path / "after_kill.pt")
    assert runs["resumed"]["global_step"] == runs["straight"]["global_step"] == 6
    for name, tensor in runs["straight"]["weights"].items():
        assert torch.equal(runs["resumed"]["weights"][name], tensor), name
    saved = torch.load(io.BytesIO(fs.cat_file(f"{bucket}/ck/epoch=0-step=6.ckpt/fw_state.pt")), weights_only=True)
    assert saved["global_step"] == 6


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


KILLED_IN_UPLOAD = """
import json, os, signal, sys, threading
import s3fs
import torch
from torch.utils.data import DataLoader, TensorDataset
import framework as fw
import framework.paths as fw_paths
from framework.callbacks import ModelCheckpoint

out, root, mode, kill_at = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
pipe_file, call_s3 = s3fs.S3FileSystem._pipe_file, s3fs.S3FileSystem._call_s3


async def in_5_mib_parts(self, path, data, chunksize=None, **kwargs):  # a multipart upload from 10 MiB on
    return await pipe_file(self, path, data, chunksize=5 * 2**20, **kwargs)


async def die_before_completing(self, method, *args, **kwargs):  # the parts are on the server
    if method == "complete_multipart_upload" and kwargs["Key"].endswith("/" + kill_at):
        with open(out + "/killed.txt", "w") as f:
            f.write(f"{kwargs['Key']} {uploading_in[-1]}")
        os.kill(os.getpid(), signal.SIGKILL)
    return await call_s3(self, method, *args, **kwargs)


def noting_the_thread(url, data):  # fw's upload thread, or the training's (s3fs's calls run in its own)
    uploading_in.append(threading.current_thread().name)
    return write_bytes(url, data)


uploading_in, write_bytes = [], fw_paths.write_bytes
fw_paths.write_bytes = noting_the_thread
s3fs.S3FileSystem._pipe_file, s3fs.S3FileSystem._call_s3 = in_5_mib_parts, die_before_completing
s3fs.S3FileSystem.clear_instance_cache()  # instances bind these methods when made


class Wide(fw.TrainModule):  # 1M weights and AdamW's two moments: a 12 MiB checkpoint
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(1024, 1024)

    def training_step(self, batch, batch_idx):
        return torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class Started(fw.Callback):
    def on_train_start(self, trainer, module):
        with open(out + "/started.json", "w") as f:
            json.dump({"ckpt_path": trainer.ckpt_path, "step": trainer.global_step}, f)


fw.seed_everything(0)
data = DataLoader(TensorDataset(torch.randn(32, 1024), torch.randn(32, 1024)), batch_size=4, shuffle=True)
trainer = fw.Trainer(accelerator="cpu", max_steps=8, logger=False, enable_progress_bar=False,
                     enable_model_summary=False, default_root_dir=root, async_upload=mode == "async",
                     callbacks=[ModelCheckpoint(dirpath=root + "/ck", every_n_train_steps=2, save_top_k=-1), Started()])
model = Wide()
trainer.fit(model, data, ckpt_path="last")
torch.save({"step": trainer.global_step, "weights": model.state_dict()}, out + "/final.pt")
"""


@pytest.fixture(scope="module")
def never_stopped(tmp_path_factory) -> dict:
    """The fit of ``KILLED_IN_UPLOAD`` to a local folder, never stopped: its last step and weights."""
    out = tmp_path_factory.mktemp("never_stopped")
    script = write_script(out, KILLED_IN_UPLOAD)
    check_ok(forked.run_script(script, str(out), str(out / "run"), "sync", "-", timeout=60))
    return torch.load(out / "final.pt")


@pytest.mark.timeout(150)
@pytest.mark.parametrize(("mode", "killed_in"), [("sync", "epoch=0-step=4.ckpt"), ("async", "epoch=0-step=4.ckpt"),
                                                 ("async", "epoch=0-step=2.ckpt")],
                         ids=["uploaded-in-the-save", "uploaded-in-background", "the-first-in-background"])
def test_a_fit_killed_during_a_checkpoint_upload_leaves_nothing_that_last_picks(s3, bucket, tmp_path, never_stopped,
                                                                                mode, killed_in):
    script = write_script(tmp_path, KILLED_IN_UPLOAD)
    root, folder = f"s3://{bucket}/run", f"{bucket}/run/ck"
    killed = forked.run_script(script, str(tmp_path), root, mode, killed_in, timeout=60)
    assert killed.returncode == -signal.SIGKILL, killed.output
    uploader = "fw-uploads" if mode == "async" else "MainThread"  # the training went on during the upload, or waited
    assert (tmp_path / "killed.txt").read_text() == f"run/ck/{killed_in} {uploader}"

    # the upload was in flight: its parts are in the bucket, its object is not, nor in the index
    fs = s3.filesystem()
    before = "epoch=0-step=2.ckpt" if killed_in.endswith("step=4.ckpt") else None
    listed = {key.removeprefix(folder + "/") for key in fs.find(folder)}
    assert listed == ({before, ".fw-checkpoints.json"} if before else set()), listed
    if before:
        assert set(json.loads(fs.cat_file(f"{folder}/.fw-checkpoints.json"))) == {before}
    client = s3.client()
    [upload] = client.list_multipart_uploads(Bucket=bucket)["Uploads"]
    assert upload["Key"] == f"run/ck/{killed_in}"
    parts = client.list_parts(Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"])["Parts"]
    assert len(parts) == 3 and sum(p["Size"] for p in parts) > 12 * 2**20  # the whole checkpoint was sent

    resumed = forked.run_script(script, str(tmp_path), root, mode, "-", timeout=60)
    check_ok(resumed)
    started = json.loads((tmp_path / "started.json").read_text())
    if before:
        assert started == {"ckpt_path": f"s3://{folder}/{before}", "step": 2}
    else:
        assert started == {"ckpt_path": None, "step": 0}
        assert "ckpt_path='last': no checkpoint under" in resumed.output and "starting fresh" in resumed.output
    final = torch.load(tmp_path / "final.pt")
    assert final["step"] == never_stopped["step"] == 8
    for name, tensor in never_stopped["weights"].items():
        assert torch.equal(final["weights"][name], tensor), name
    fs.invalidate_cache()
    steps = {key.removeprefix(folder + "/") for key in fs.find(folder)} - {".fw-checkpoints.json"}
    assert steps == {f"epoch=0-step={n}.ckpt" for n in (2, 4, 6, 8)}, steps
    saved = torch.load(io.BytesIO(fs.cat_file(f"{folder}/{killed_in}")), weights_only=True)
    assert saved["global_step"] == int(killed_in.split("=")[-1].removesuffix(".ckpt"))
