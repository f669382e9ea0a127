"""A sharded (FSDP/DCP) checkpoint in an S3 bucket: 2 FSDP ranks over Gloo save every 10 steps to
``s3://bucket/ck``; rank 1 is SIGKILLed right after DCP wrote the step-20 folder's shards and
``.metadata``, before fw's ``fw_state.pt`` and ``COMMITTED``. That folder is in the bucket but never
loaded nor chosen: ``ckpt_path="last"`` resumes the step-10 one, bit for bit against a run never
stopped, and the resumed run, which removes that folder first, writes it whole."""

from __future__ import annotations

import io

import forked
import pytest
import torch
from distributed.helpers import check_ok, write_script

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
