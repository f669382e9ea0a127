"""Resuming on another number of ranks (DESIGN property 4): a checkpoint written at an epoch end
resumes on any number of ranks and, with the same global batch, ends within float noise of the
run that was never stopped; a mid-epoch checkpoint is refused on another number of ranks (its
position, counted in batches per rank, would train some samples twice and skip others), with a
one-line error that says why and what to do, before anything is loaded.

One 2-rank Gloo job serves every case: it trains the reference run (writing a mid-epoch and an
end-of-epoch checkpoint) and then tries to resume a 1-rank mid-epoch checkpoint."""

from __future__ import annotations

import re

import pytest
import torch
from distributed import workload
from distributed.helpers import check_ok, write_script
from forked import run_script
from torch.utils.data import DataLoader

import framework as fw
from framework.checkpoint import load_checkpoint
from framework.cli import main as fw_main
from framework.errors import CheckpointError

B = 4  # per-rank batch on 2 ranks; one process takes 2 * B: the same global batch
SCRIPT = """
import sys
from pathlib import Path
import torch
from torch.utils.data import DataLoader
import framework as fw
from framework.callbacks import ModelCheckpoint
from framework.errors import CheckpointError
import workload

out, one_rank_mid = Path(sys.argv[1]), sys.argv[2]
B = int(sys.argv[3])

class SaveMidEpoch(fw.Callback):
    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == 3:  # 3 of epoch 0's 8 batches per rank
            trainer.save_checkpoint(out / "mid_epoch.ckpt")

fw.seed_everything(0)
model = workload.Regressor()
args = {**workload.FIT_ARGS, "enable_checkpointing": True}
callbacks = [SaveMidEpoch(), ModelCheckpoint(dirpath=str(out / "ck"), save_top_k=-1)]  # epoch=0-step=8.ckpt, ...
trainer = fw.Trainer(devices=2, strategy="ddp_gloo", max_epochs=2, callbacks=callbacks, **args)
trainer.fit(model, DataLoader(workload.regression_data(64), batch_size=B))
torch.save(model.state_dict(), out / f"straight_rank{trainer.global_rank}.pt")

# a checkpoint that 1 process wrote mid-epoch: every rank refuses it alike (none waits for another)
again = fw.Trainer(devices=2, strategy="ddp_gloo", max_epochs=2, **workload.FIT_ARGS)
try:
    again.fit(workload.Regressor(), DataLoader(workload.regression_data(64), batch_size=B), ckpt_path=one_rank_mid)
except CheckpointError as err:
    (out / f"refused_rank{again.global_rank}.txt").write_text(str(err))
"""


def _fit_one_process(ckpt: str | None = None, batch_size: int = 2 * B, **limits) -> tuple[fw.Trainer, fw.TrainModule]:
    fw.seed_everything(0)
    model = workload.Regressor()
    trainer = fw.Trainer(devices=1, strategy="single", **limits, **workload.FIT_ARGS)
    trainer.fit(model, DataLoader(workload.regression_data(64), batch_size=batch_size), ckpt_path=ckpt)
    return trainer, model


def _one_line_refusal(err: BaseException, saved: str, now: int) -> str:
    text = str(err)
    assert "\n" not in text
    assert re.search(rf"stopped mid-epoch \(epoch 0, after 3 batches per rank\) on {saved}, and this run has {now}",
                     text), text
    assert "cannot be mapped exactly" in text and f"Resume on {saved}" in text and "at an epoch end" in text, text
    return text


@pytest.mark.timeout(60)
def test_a_checkpoint_resumes_on_another_number_of_ranks_only_from_an_epoch_end(tmp_path, capsys):
    one_rank_mid = tmp_path / "one_rank_mid.ckpt"
    stopped, _ = _fit_one_process(max_steps=3)
    stopped.save_checkpoint(one_rank_mid)
    check_ok(run_script(write_script(tmp_path, SCRIPT), str(tmp_path), str(one_rank_mid), str(B), nprocs=2, timeout=60))

    # 1 rank's mid-epoch position refused on 2 ranks, by both
    for rank in (0, 1):
        _one_line_refusal((tmp_path / f"refused_rank{rank}.txt").read_text(), "1 rank", 2)

    straight = [torch.load(tmp_path / f"straight_rank{rank}.pt") for rank in (0, 1)]
    assert all(torch.equal(straight[0][k], straight[1][k]) for k in straight[0])

    # 2 ranks' end-of-epoch checkpoint on 1 process with the same global batch: property 4
    end_of_epoch = tmp_path / "ck" / "epoch=0-step=8.ckpt"
    saved = load_checkpoint(end_of_epoch)
    assert saved["world_size"] == 2 and saved["loop"]["epoch_finished"], saved["loop"]
    resumed_trainer, resumed = _fit_one_process(str(end_of_epoch), max_epochs=2)
    assert resumed_trainer.global_step == 16
    for key, value in straight[0].items():
        torch.testing.assert_close(resumed.state_dict()[key], value, rtol=0, atol=1e-5, msg=key)
    # the resumed half trained: its end is not the checkpoint's start
    assert any(not torch.allclose(resumed.state_dict()[k], saved["state_dict"][k], atol=1e-4) for k in straight[0])

    # 2 ranks' mid-epoch position refused on 1 process, before anything is loaded
    mid = tmp_path / "mid_epoch.ckpt"
    assert load_checkpoint(mid)["loop"]["batches_done"] == 3
    fw.seed_everything(0)
    model = workload.Regressor()
    fresh = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = fw.Trainer(devices=1, max_epochs=2, **workload.FIT_ARGS)
    with pytest.raises(CheckpointError) as refused:
        trainer.fit(model, DataLoader(workload.regression_data(64), batch_size=2 * B), ckpt_path=str(mid))
    _one_line_refusal(refused.value, "2 ranks", 1)
    assert all(torch.equal(model.state_dict()[k], fresh[k]) for k in fresh) and trainer.global_step == 0

    # through the CLI: one line, exit 1, no traceback
    recipe = tmp_path / "r.yaml"
    recipe.write_text("module:\n  _target_: distributed.workload.Regressor\ndata:\n  _target_: toy.ToyData\n"
                      "  n: 64\n  batch_size: 8\ntrainer:\n  max_epochs: 2\n  accelerator: cpu\n  devices: 1\n"
                      f"  default_root_dir: {tmp_path / 'cli'}\nlogger: false\n")
    capsys.readouterr()
    assert fw_main(["fit", str(recipe), f"ckpt_path={mid}"]) == 1
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith("fw: error: ckpt_path"), err
    _one_line_refusal(err.strip().splitlines()[-1], "2 ranks", 1)
    assert "Traceback" not in err


def test_a_mid_epoch_checkpoint_is_refused_with_another_batch_size(tmp_path):
    """The same count of batches is another number of samples: refused; at the epoch end the
    batch size may change."""
    stopped, _ = _fit_one_process(max_steps=3)
    stopped.save_checkpoint(tmp_path / "mid.ckpt")
    assert load_checkpoint(tmp_path / "mid.ckpt")["train_batch_size"] == 2 * B
    with pytest.raises(CheckpointError, match=r"after 3 batches per rank\) with 8 samples per batch per rank, and "
                                              r"this run's training batch size is 4: .* Resume with batch size 8"):
        _fit_one_process(str(tmp_path / "mid.ckpt"), batch_size=4, max_epochs=1)
    ended, _ = _fit_one_process(max_epochs=1)
    ended.save_checkpoint(tmp_path / "end.ckpt")
    resumed, _ = _fit_one_process(str(tmp_path / "end.ckpt"), batch_size=4, max_epochs=2)
    assert resumed.global_step == 8 + 16
