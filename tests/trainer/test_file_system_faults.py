"""File-system faults are one-line errors that name the path, and nothing saved is lost: a file
where a folder should be, a read-only folder, a full disk (read-only and full use small tmpfs
mounts, so they need root; they skip with a reason otherwise)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from conftest import subprocess_env
from toy import QUIET, LinearModel, loader, regression_data

import framework as fw
from framework.callbacks import ModelCheckpoint
from framework.errors import CheckpointError, ConfigError


def test_a_file_as_default_root_dir_is_a_one_line_cli_error(tmp_path):
    (tmp_path / "runs").write_text("a file, not a folder")
    from forked import fw_command

    repo = Path(__file__).resolve().parents[2]
    proc = fw_command("fit", str(repo / "conf/digits.yaml"), f"trainer.default_root_dir={tmp_path}/runs",
                      "trainer.enable_progress_bar=false", cwd=repo, env=subprocess_env())
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(
        f"fw: error: trainer.default_root_dir '{tmp_path}/runs' is not a writable directory (NotADirectoryError")
    assert "Traceback" not in proc.stderr


def test_a_read_only_default_root_dir_fails_before_training(mount):
    read_only = mount("ro,size=1m")
    seen = []

    class Probe(LinearModel):
        def training_step(self, batch, batch_idx):
            seen.append(batch_idx)
            return super().training_step(batch, batch_idx)

    with pytest.raises(ConfigError, match=r"default_root_dir '.*' is not a writable directory \(OSError: Read-only"):
        fw.Trainer(**QUIET, max_epochs=1, default_root_dir=str(read_only / "runs")).fit(
            Probe(), loader(regression_data(16), 8))
    assert seen == []


def test_an_unwritable_checkpoint_dir_is_named_at_the_start(tmp_path):
    (tmp_path / "ck").write_text("a file")
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ck" / "inner")
    with pytest.raises(ConfigError, match=r"ModelCheckpoint dirpath '.*ck/inner' is not a writable directory"):
        fw.Trainer(**{**QUIET, "enable_checkpointing": True}, max_epochs=1, callbacks=[ckpt]).fit(
            LinearModel(), loader(regression_data(16), 8))


def test_a_full_disk_keeps_the_earlier_checkpoints(mount):
    small = mount("size=64k")
    trainer = fw.Trainer(**QUIET, max_steps=1)
    model = LinearModel()
    trainer.fit(model, loader(regression_data(16), 8))
    trainer.save_checkpoint(small / "good.ckpt")
    good = (small / "good.ckpt").read_bytes()
    model.big = torch.nn.Parameter(torch.zeros(64 * 1024))  # 256 KB: does not fit
    with pytest.raises(CheckpointError, match=r"writing the checkpoint '.*big.ckpt' failed \(OSError: No space left"):
        trainer.save_checkpoint(small / "big.ckpt")
    assert (small / "good.ckpt").read_bytes() == good
    assert sorted(os.listdir(small)) == [".fw-checkpoints.json", "good.ckpt"]  # no half-written file left behind
