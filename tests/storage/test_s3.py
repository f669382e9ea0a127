"""fw's outputs in an S3 bucket (moto's S3 server on 127.0.0.1, read back with s3fs): ``fw fit``
with ``trainer.default_root_dir=s3://bucket/run`` writes its checkpoints, TensorBoard events,
hyperparameters and recipe (and ``fw predict`` its predictions) into the bucket and nothing on the local disk (it made a local folder
named ``s3:``); ``ckpt_path=last`` finds the checkpoint there and resumes bit for bit; a missing
bucket or a refused key is one line naming the URL, with nothing written anywhere."""

from __future__ import annotations

import io
import re

import pytest
import torch
from conftest import ROOT, subprocess_env
from forked import fw_command
from lightning.modules import QUIET, make_regressor, regression_loader

import framework as fw
from framework.errors import ConfigError

pytestmark = pytest.mark.procs  # the server process (conftest.py)

#: digits, short: 3 epochs of 4 batches (its learning rate follows a cosine over max_epochs), no progress bar
SHORT = ("trainer.max_epochs=3", "trainer.limit_train_batches=4", "trainer.limit_val_batches=2",
         "trainer.enable_progress_bar=false")


def _fw(*args: str, cwd, **env: str):
    return fw_command(*args, cwd=cwd, env={**subprocess_env(), **env}, timeout=90)


def _load(s3, key: str) -> dict:
    return torch.load(io.BytesIO(s3.filesystem().cat_file(key)), weights_only=True)


@pytest.mark.timeout(120)
def test_fit_writes_into_the_bucket_and_resumes_from_last_bit_exactly(s3, bucket, tmp_path):
    digits = str(ROOT / "conf" / "digits.yaml")
    run, straight = f"s3://{bucket}/run", f"s3://{bucket}/straight"
    # stopped in the middle of its second epoch (max_steps): last.ckpt is that step's
    first = _fw("fit", digits, f"trainer.default_root_dir={run}", "trainer.max_steps=6", *SHORT, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert f"best checkpoint {run}/fw_logs/version_0/checkpoints/" in first.stdout + first.stderr
    listed = {key.removeprefix(f"{bucket}/run/") for key in s3.filesystem().find(f"{bucket}/run")}
    version = "fw_logs/version_0"
    for name in ("checkpoints/epoch=0-step=4.ckpt", "checkpoints/last.ckpt", "checkpoints/.fw-checkpoints.json",
                 "hparams.yaml", "config.yaml"):
        assert f"{version}/{name}" in listed, sorted(listed)
    assert any(key.startswith(f"{version}/events.out.tfevents.") for key in listed), sorted(listed)
    assert list(tmp_path.iterdir()) == []  # no local folder 's3:', nothing else either

    # the resumed run takes its credentials from the recipe (storage_options), not the environment
    key, secret = s3.env["AWS_ACCESS_KEY_ID"], s3.env["AWS_SECRET_ACCESS_KEY"]
    resumed = _fw("fit", digits, f"trainer.default_root_dir={run}", "ckpt_path=last",
                  f"trainer.storage_options={{key: {key}, secret: {secret}}}", *SHORT, cwd=tmp_path,
                  AWS_ACCESS_KEY_ID="", AWS_SECRET_ACCESS_KEY="")
    assert resumed.returncode == 0, resumed.stderr
    assert f"loaded {run}/{version}/checkpoints/last.ckpt (step 6)" in resumed.stdout + resumed.stderr
    whole = _fw("fit", digits, f"trainer.default_root_dir={straight}", *SHORT, cwd=tmp_path)
    assert whole.returncode == 0, whole.stderr
    assert list(tmp_path.iterdir()) == []

    # fw predict's output goes into the bucket too (the run folder of its own version)
    predicted = _fw("predict", digits, f"trainer.default_root_dir={run}", "ckpt_path=last", *SHORT, cwd=tmp_path)
    assert predicted.returncode == 0, predicted.stderr
    written = [key for key in s3.filesystem().find(f"{bucket}/run") if key.endswith("/predictions.pt")]
    said = re.search(rf"wrote (\d+) predictions to s3://{re.escape(written[0])}\n", predicted.stderr)
    assert len(written) == 1 and said, predicted.stderr
    assert len(_load(s3, written[0])) == int(said.group(1)) > 300  # the digits' validation split
    assert list(tmp_path.iterdir()) == []

    got = _load(s3, f"{bucket}/run/{version}/checkpoints/last.ckpt")
    want = _load(s3, f"{bucket}/straight/{version}/checkpoints/last.ckpt")
    assert got["global_step"] == want["global_step"] == 12
    for name, tensor in want["state_dict"].items():
        assert torch.equal(got["state_dict"][name], tensor), name


@pytest.mark.timeout(60)
def test_a_missing_bucket_is_one_line_naming_the_url_and_nothing_is_written(s3, tmp_path):
    url = "s3://no-such-bucket/run"
    proc = _fw("fit", str(ROOT / "conf" / "digits.yaml"), f"trainer.default_root_dir={url}", *SHORT, cwd=tmp_path)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"fw: error: trainer.default_root_dir='{url}': the bucket 'no-such-bucket' does not "
                           f"exist at {s3.endpoint}; create it"), proc.stderr
    assert "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []
    assert not s3.filesystem().exists("no-such-bucket")


@pytest.mark.timeout(60)
def test_refused_credentials_are_one_line_and_nothing_is_written(s3, bucket, tmp_path):
    url = f"s3://{bucket}/run"
    trainer = fw.Trainer(**{**QUIET, "max_epochs": 1, "enable_checkpointing": True}, default_root_dir=url,
                         storage_options={"key": "AKIAWRONG", "secret": "wrong"})
    with pytest.raises(ConfigError) as err:
        trainer.fit(make_regressor(fw.TrainModule)(), regression_loader())
    message = str(err.value)
    assert message.startswith(f"trainer.default_root_dir='{url}': the storage refused the credentials"), message
    assert "AWS_ACCESS_KEY_ID" in message and "\n" not in message
    assert list(tmp_path.iterdir()) == [] and s3.filesystem().find(bucket) == []


@pytest.mark.timeout(60)
def test_save_checkpoint_and_every_way_back_read_a_url(s3, bucket, tmp_path):
    """``trainer.save_checkpoint(url)``, then ``fit``/``test`` with ``ckpt_path=url`` and
    ``load_from_checkpoint(url)``: the same weights."""
    trainer = fw.Trainer(**{**QUIET, "max_epochs": 1})
    model = make_regressor(fw.TrainModule)()
    trainer.fit(model, regression_loader())
    url = f"s3://{bucket}/saved/model.ckpt"
    trainer.save_checkpoint(url)
    assert s3.filesystem().exists(f"{bucket}/saved/model.ckpt")
    again = make_regressor(fw.TrainModule)()
    fw.Trainer(**{**QUIET, "max_epochs": 2}).fit(again, regression_loader(), ckpt_path=url)
    loaded = make_regressor(fw.TrainModule).load_from_checkpoint(url)
    assert torch.equal(loaded.layer.weight, model.layer.weight)
    assert list(tmp_path.iterdir()) == []
