"""Checkpoints written by an older fw still load and resume bit for bit (``tests/fixtures``:
format 1, written by main at c6c2559 before checkpoints were saved as stateful parts)."""

from __future__ import annotations

import torch

from framework import checkpoint as ckpt
from fixtures.old_checkpoint import CHECKPOINT, FINAL, fit


def _assert_same_end(trainer) -> None:
    final = torch.load(FINAL, weights_only=False)
    for name, value in trainer.lightning_module.state_dict().items():
        assert torch.equal(value, final["state_dict"][name]), name
    for name, value in final["callback_metrics"].items():
        assert torch.equal(trainer.callback_metrics[name], value), name


def test_the_fixture_run_gives_the_same_numbers_today(tmp_path):
    _assert_same_end(fit(root=str(tmp_path)))


def test_a_format_1_mid_epoch_checkpoint_resumes_bit_for_bit(tmp_path):
    assert torch.load(CHECKPOINT, weights_only=False)["fw_format"] == 1
    trainer = fit(ckpt_path=CHECKPOINT, root=str(tmp_path))
    assert trainer.global_step == 16
    _assert_same_end(trainer)


def test_new_checkpoints_carry_the_current_format_version(tmp_path):
    trainer = fit(root=str(tmp_path))
    trainer.save_checkpoint(tmp_path / "now.ckpt")
    assert torch.load(tmp_path / "now.ckpt", weights_only=False)["fw_format"] == ckpt.FORMAT_VERSION
