"""Checkpoint faults say what is wrong: a directory as ckpt_path, a checkpoint of another
model (naming the parameters), and what killed writes left behind is cleared at the next start."""

from __future__ import annotations

import os

import pytest
from toy import QUIET, LinearModel, loader, regression_data

import framework as fw
from framework.callbacks import ModelCheckpoint
from framework.errors import CheckpointError


def _saved(tmp_path):
    trainer = fw.Trainer(**QUIET, max_steps=2)
    trainer.fit(LinearModel(), loader(regression_data(16), 8))
    path = tmp_path / "ck" / "a.ckpt"
    trainer.save_checkpoint(path)
    return path


def test_a_directory_as_ckpt_path_says_so_and_lists_what_is_inside(tmp_path):
    path = _saved(tmp_path)
    with pytest.raises(CheckpointError, match=r"is a directory: give a checkpoint file in it; it holds a.ckpt"):
        fw.Trainer(**QUIET, max_steps=3).fit(LinearModel(), loader(regression_data(16), 8), ckpt_path=str(path.parent))


def test_a_checkpoint_of_another_model_names_the_parameters(tmp_path):
    path = _saved(tmp_path)
    with pytest.raises(CheckpointError, match=r"does not fit this model: size mismatch for net.weight") as err:
        fw.Trainer(**QUIET, max_steps=3).fit(LinearModel(features=3), loader(regression_data(16, features=3), 8),
                                             ckpt_path=str(path))
    assert err.value.exit_code == 1


def test_stale_temp_files_of_killed_writes_are_removed_at_the_next_start(tmp_path):
    ck = tmp_path / "ck"
    ck.mkdir()
    stale = ck / ".last.ckpt.abc123.tmp"
    stale.write_bytes(b"half a checkpoint")
    keep = ck / "notes.txt"
    keep.write_text("not ours")
    from framework.loggers.checkpoint_uploads import stage

    staged = stage(str(keep), metadata={"score": 1.0})  # a logger's upload, its process killed before it ended
    trainer = fw.Trainer(**{**QUIET, "enable_checkpointing": True}, max_steps=1,
                         callbacks=[ModelCheckpoint(dirpath=ck, save_last=True)])
    trainer.fit(LinearModel(), loader(regression_data(16), 8))
    assert not stale.exists() and not os.path.exists(staged) and keep.read_text() == "not ours"
    assert sorted(os.listdir(ck)) == [".fw-checkpoints.json", "epoch=0-step=1.ckpt", "last.ckpt", "notes.txt"]


def test_a_resume_continues_in_the_same_version_folder_and_save_top_k_holds(tmp_path):
    from framework.loggers import CSVLogger

    def run(epochs, ckpt=None):
        trainer = fw.Trainer(accelerator="cpu", devices=1, enable_progress_bar=False, max_epochs=epochs,
                             default_root_dir=str(tmp_path), logger=CSVLogger(),
                             callbacks=[ModelCheckpoint(save_top_k=1, save_last=True)])
        trainer.fit(LinearModel(), loader(regression_data(16), 8), ckpt_path=ckpt)
        return trainer

    first = run(2)
    last = os.path.join(first.log_dir, "checkpoints", "last.ckpt")
    run(4, ckpt=last)
    run(5, ckpt="last")
    assert sorted(os.listdir(tmp_path / "fw_logs")) == ["version_0"]
    assert sorted(os.listdir(tmp_path / "fw_logs" / "version_0" / "checkpoints")) == [".fw-checkpoints.json",
        "epoch=4-step=10.ckpt", "last.ckpt"]


def test_a_checkpoint_with_other_optimizers_or_schedulers_is_refused_not_half_restored(tmp_path):
    path = _saved(tmp_path)  # one optimizer, no scheduler
    with_scheduler = LinearModel(scheduler={"interval": "epoch"})
    with pytest.raises(CheckpointError, match=r"holds 0 LR scheduler state\(s\) and configure_optimizers\(\) returned 1"):
        fw.Trainer(**QUIET, max_steps=3).fit(with_scheduler, loader(regression_data(16), 8), ckpt_path=str(path))
