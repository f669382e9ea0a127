"""Checkpoints written by an older fw still load and resume bit for bit (``tests/fixtures``:
format 1, written by main at c6c2559 before checkpoints were saved as stateful parts).

The fixture's weights were computed on the machine that wrote it, and float kernels round
differently on other processors (MKL and ATen pick code paths by instruction set: this project's
machines have moved between them). So what can be checked anywhere is checked anywhere: the
state a format-1 file restores, the samples the resumed run reads, and that it continues exactly
as a checkpoint of today's format of that same state does. The end against the fixture's own
uninterrupted run is compared bit for bit on a machine whose run today reproduces that run.
"""

from __future__ import annotations

import pytest
import torch
from fixtures.old_checkpoint import CHECKPOINT, FINAL, fit
from fixtures.resume_checks import Record
from fixtures.resume_checks import equal as _equal
from fixtures.resume_checks import weights as _weights

import framework as fw
from framework.checkpointing import file as ckpt


def _recorded(save_to: str | None = None, **kwargs) -> tuple[fw.Trainer, Record]:
    record = Record(save_to)
    return fit(extra_callbacks=[record], **kwargs), record


def test_a_format_1_mid_epoch_checkpoint_restores_its_state_and_reads_the_rest_of_the_epoch(tmp_path):
    old = torch.load(CHECKPOINT, weights_only=False)
    assert old["fw_format"] == 1
    straight, seen = _recorded(root=str(tmp_path / "straight"))
    now = str(tmp_path / "now.ckpt")
    resumed, read = _recorded(save_to=now, ckpt_path=CHECKPOINT, root=str(tmp_path / "resumed"))
    assert resumed.global_step == straight.global_step == 16
    # the data position: the run goes on with batch 4 of epoch 1, the samples the straight run read there
    assert len(read.batches) == 4 and all(torch.equal(a, b) for a, b in zip(read.batches, seen.batches[12:], strict=True))
    # what the file held is what the run went on from (today's format, written before the first step)
    new = torch.load(now, weights_only=False)
    assert new["fw_format"] == ckpt.FORMAT_VERSION and (new["epoch"], new["global_step"]) == (1, 12)
    assert _equal(new["state_dict"], old["state_dict"])
    for key in ("optimizer_states", "lr_schedulers"):
        torch.testing.assert_close(new[key], old[key], rtol=0, atol=0)
    assert new["metrics"][0]["train/loss"]["weight"] == old["metrics"][0]["train/loss"]["weight"]
    assert torch.equal(new["metrics"][0]["train/loss"]["total"], old["metrics"][0]["train/loss"]["total"])
    # and it continues bit for bit as that checkpoint of today's format does
    again = fit(ckpt_path=now, root=str(tmp_path / "again"))
    assert _equal(_weights(again), _weights(resumed))
    assert _equal(dict(again.callback_metrics), dict(resumed.callback_metrics))
    # within rounding of today's straight run (bit for bit below, where this machine rounds as the fixture's did)
    for name, value in _weights(resumed).items():
        torch.testing.assert_close(value, _weights(straight)[name], rtol=0, atol=1e-5)


def _fixture_end_reproduced(tmp_path) -> dict:
    final = torch.load(FINAL, weights_only=False)
    if not _equal(_weights(fit(root=str(tmp_path / "straight"))), final["state_dict"]):
        pytest.skip(f"this machine's float kernels ({torch.backends.cpu.get_cpu_capability()}) round differently "
                    "from those of the machine that wrote the fixture: its uninterrupted run ends elsewhere in the "
                    "last bits; the state, data position and continuation are checked in the test above")
    return final


def test_on_the_fixture_s_rounding_a_format_1_checkpoint_resumes_to_its_run_s_end_bit_for_bit(tmp_path):
    final = _fixture_end_reproduced(tmp_path)
    trainer = fit(ckpt_path=CHECKPOINT, root=str(tmp_path / "resumed"))
    assert trainer.global_step == 16
    assert _equal(_weights(trainer), final["state_dict"])
    for name, value in final["callback_metrics"].items():
        assert torch.equal(trainer.callback_metrics[name], value), name


def test_new_checkpoints_carry_the_current_format_version(tmp_path):
    trainer = fit(root=str(tmp_path))
    trainer.save_checkpoint(tmp_path / "now.ckpt")
    assert torch.load(tmp_path / "now.ckpt", weights_only=False)["fw_format"] == ckpt.FORMAT_VERSION
