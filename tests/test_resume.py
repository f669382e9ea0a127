"""Exact resume: a run stopped and resumed in a new process ends bit-identical to one never
stopped (shuffled loader, dropout, Adam, step-wise LR schedule), at an epoch boundary and
mid-epoch. Corrupt checkpoints give a clear error and are never overwritten."""

from __future__ import annotations

import textwrap
from pathlib import Path

import forked
import pytest
import torch
from conftest import subprocess_env
from toy import QUIET, DropoutMLP, loader, regression_data

import framework as fw
from framework.callbacks import ModelCheckpoint
from framework.checkpointing.file import load_checkpoint
from framework.errors import CheckpointError

RUN = textwrap.dedent(
    """
    import sys, torch, framework as fw
    from framework.callbacks import ModelCheckpoint
    from toy import DropoutMLP, regression_data, loader
    out, max_epochs, every_n, ckpt = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    fw.seed_everything(7)
    model = DropoutMLP()
    data = regression_data(40)
    callbacks = [ModelCheckpoint(dirpath=out + "_ckpt", save_last=True, save_top_k=-1,
                                 every_n_train_steps=every_n or None, filename="{epoch}-{step}")]
    trainer = fw.Trainer(max_epochs=max_epochs, logger=False, enable_progress_bar=False, accelerator="cpu",
                         devices=1, callbacks=callbacks, num_sanity_val_steps=2)
    trainer.fit(model, loader(data, 8, shuffle=True), loader(data, 16), ckpt_path=None if ckpt == "-" else ckpt)
    torch.save({"params": model.state_dict(), "step": trainer.global_step,
                "lr": trainer.optimizers[0].param_groups[0]["lr"]}, out)
    """
)


def _run(tmp_path: Path, name: str, max_epochs: int, every_n: int = 0, ckpt: str = "-") -> dict:
    script = tmp_path / "run.py"
    script.write_text(RUN)
    out = tmp_path / name
    # a process of its own (forked from this one, tests/forked.py: nothing of the run before is in it)
    done = forked.run_script(script, str(out), str(max_epochs), str(every_n), ckpt, env=subprocess_env(),
                             timeout=120)
    assert done.returncode == 0, done.output
    return torch.load(out)


def _assert_bit_identical(a: dict, b: dict) -> None:
    assert a["step"] == b["step"] and a["lr"] == b["lr"]
    for key in a["params"]:
        assert torch.equal(a["params"][key], b["params"][key]), key


@pytest.mark.timeout(60)
def test_resume_after_epoch_k_in_new_process_is_bit_identical(tmp_path):
    straight = _run(tmp_path, "straight", max_epochs=4)
    _run(tmp_path, "first_half", max_epochs=2)
    resumed = _run(tmp_path, "resumed", max_epochs=4, ckpt=str(tmp_path / "first_half_ckpt" / "last.ckpt"))
    _assert_bit_identical(straight, resumed)
    # the check has teeth: a fresh run with another seed-free start differs
    assert not torch.equal(straight["params"]["net.0.weight"], DropoutMLP().state_dict()["net.0.weight"])


@pytest.mark.timeout(60)
def test_resume_mid_epoch_in_new_process_is_bit_identical(tmp_path):
    straight = _run(tmp_path, "straight", max_epochs=3)
    _run(tmp_path, "saver", max_epochs=3, every_n=7)  # 5 batches per epoch: step 7 is mid-epoch 1
    mid = tmp_path / "saver_ckpt" / "epoch=1-step=7.ckpt"
    assert load_checkpoint(mid)["loop"] == {  # the run state, saved as one piece
        "epoch": 1, "global_step": 7, "batches_stepped": 7, "batches_done": 2, "epoch_finished": False,
        "stop_reason": None}
    resumed = _run(tmp_path, "resumed", max_epochs=3, ckpt=str(mid))
    _assert_bit_identical(straight, resumed)


def test_checkpoint_contents_and_atomic_write(tmp_path):
    fw.seed_everything(0)
    trainer = fw.Trainer(max_epochs=1, **QUIET)
    model = DropoutMLP()
    trainer.fit(model, loader(regression_data(16), 8))
    path = tmp_path / "a.ckpt"
    trainer.save_checkpoint(path)
    ckpt = load_checkpoint(path)
    assert {"state_dict", "optimizer_states", "lr_schedulers", "rng", "epoch", "global_step", "callbacks"} <= set(ckpt)
    assert ckpt["global_step"] == 2 and len(ckpt["rng"]) == 1
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # no temp file left


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_corrupt_checkpoint_is_a_clear_error_and_is_not_overwritten(tmp_path, damage):
    fw.seed_everything(0)
    ckpt_dir = tmp_path / "ck"
    trainer = fw.Trainer(max_epochs=1, logger=False, enable_progress_bar=False, accelerator="cpu", devices=1,
                         callbacks=[ModelCheckpoint(dirpath=ckpt_dir, save_last=True)])
    trainer.fit(DropoutMLP(), loader(regression_data(16), 8))
    last = ckpt_dir / "last.ckpt"
    data = last.read_bytes()
    last.write_bytes({"truncate": data[: len(data) // 2], "garbage": b"not a checkpoint" * 10, "empty": b""}[damage])
    damaged = last.read_bytes()
    trainer = fw.Trainer(max_epochs=3, logger=False, enable_progress_bar=False, accelerator="cpu", devices=1,
                         callbacks=[ModelCheckpoint(dirpath=ckpt_dir, save_last=True)])
    with pytest.raises(CheckpointError, match=r"corrupt or truncated.*left as it is"):
        trainer.fit(DropoutMLP(), loader(regression_data(16), 8), ckpt_path=str(last))
    assert last.read_bytes() == damaged


def test_missing_checkpoint_and_last_without_any(tmp_path):
    trainer = fw.Trainer(max_epochs=1, **QUIET)
    with pytest.raises(CheckpointError, match="does not exist"):
        trainer.fit(DropoutMLP(), loader(regression_data(16), 8), ckpt_path=str(tmp_path / "nope.ckpt"))
    trainer = fw.Trainer(max_epochs=1, default_root_dir=str(tmp_path), **QUIET)
    with pytest.warns(UserWarning, match="no checkpoint under"):
        trainer.fit(DropoutMLP(), loader(regression_data(16), 8), ckpt_path="last")
    assert trainer.global_step == 2


def test_last_without_save_last_is_the_newest_checkpoint_the_latest_run_wrote(tmp_path):
    trainer = fw.Trainer(max_epochs=2, default_root_dir=str(tmp_path), logger=False, enable_progress_bar=False)
    trainer.fit(DropoutMLP(), loader(regression_data(16), 8))  # ModelCheckpoint's default: no last.ckpt
    newest = trainer.checkpoint_callback.best_model_path
    again = fw.Trainer(max_epochs=3, default_root_dir=str(tmp_path), logger=False, enable_progress_bar=False)
    again.fit(DropoutMLP(), loader(regression_data(16), 8), ckpt_path="last")
    assert again.ckpt_path == newest and again.global_step == 6
