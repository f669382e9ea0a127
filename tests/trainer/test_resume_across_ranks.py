"""Resuming on another number of ranks (issue 18 item 5): the training data have one order for
any number of ranks (``data/global_order.py``), so a mid-epoch checkpoint's position, read in
samples of that order, continues on another number of ranks with the same global batch (the
per-rank batch adjusted) and ends within float noise of the run that was never stopped:
parameters, AdamW state, scheduler, step and epoch, and the logged rows (``sync_dist=True``, the
resumed epoch's aggregate included). Shuffled data, 20 AdamW steps: 2 ranks on 1, 1 on 2, 2 on 3.

What cannot carry over is refused with the reason: a mid-epoch checkpoint whose run read the
loader's own order (``use_distributed_sampler=False``) on another number of ranks or batch size.
"""

from __future__ import annotations

import pytest
import torch
from distributed import workload
from distributed.helpers import check_ok, write_script
from forked import run_script
from torch.utils.data import DataLoader

import framework as fw
from framework.checkpointing.file import load_checkpoint
from framework.cli import main as fw_main
from framework.errors import CheckpointError

GLOBAL, EPOCHS, SAVE_AT = 24, 5, 6  # 96 samples: 4 global batches an epoch; saved in epoch 1 after 2 batches

FIT = """
import sys
from pathlib import Path
import torch
from torch.utils.data import DataLoader
import framework as fw
import workload

GLOBAL, EPOCHS, SAVE_AT = 24, 5, 6


class Model(workload.Regressor):
    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.log("loss", loss, on_step=True, on_epoch=True, sync_dist=True)
        return loss

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=0.02)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 3, 0.5)}


class Record(fw.Callback):
    def __init__(self, save_to):
        self.save_to, self.rows = save_to, []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.rows.append(("step", trainer.global_step, float(trainer.callback_metrics["loss_step"])))
        if self.save_to and trainer.global_step == SAVE_AT:
            trainer.save_checkpoint(self.save_to)

    def on_train_epoch_end(self, trainer, module):
        self.rows.append(("epoch", trainer.current_epoch, float(trainer.callback_metrics["loss_epoch"])))


def fit(devices, out, ckpt_path=None, save_to=None, **trainer_args):
    fw.seed_everything(0)
    model, record = Model(), Record(save_to)
    strategy = "ddp_gloo" if devices > 1 else "single"
    trainer = fw.Trainer(devices=devices, strategy=strategy, max_epochs=EPOCHS, callbacks=[record],
                         **{**workload.FIT_ARGS, **trainer_args})
    loader = DataLoader(workload.regression_data(96), batch_size=GLOBAL // devices, shuffle=True)
    trainer.fit(model, loader, ckpt_path=ckpt_path)
    if trainer.global_rank == 0:
        torch.save({"weights": model.state_dict(), "optimizer": trainer.optimizers[0].state_dict(),
                    "scheduler": trainer.lr_scheduler_configs[0].scheduler.state_dict(), "rows": record.rows,
                    "step": trainer.global_step, "epoch": trainer.current_epoch}, out)


if __name__ == "__main__":
    out, devices = Path(sys.argv[1]), int(sys.argv[2])
    for job in sys.argv[3:]:  # tag=ckpt: resume ckpt (or "-": a straight run that saves tag.ckpt)
        tag, ckpt = job.split("=")
        fit(devices, out / f"{tag}.pt", ckpt_path=None if ckpt == "-" else ckpt,
            save_to=str(out / f"{tag}.ckpt") if ckpt == "-" else None)
"""


def _load(path) -> dict:
    return torch.load(path, weights_only=False)


def _resumed_rows(rows: list) -> list:
    """The rows a run resumed at step SAVE_AT logs: the later steps', and the epoch ends from epoch 1 on."""
    return [row for row in rows if (row[0] == "step" and row[1] > SAVE_AT) or (row[0] == "epoch" and row[1] >= 1)]


def _assert_same_end(run: dict, straight: dict, rows: list, what: str) -> None:
    assert (run["step"], run["epoch"]) == (straight["step"], straight["epoch"]) == (EPOCHS * 4, EPOCHS), what
    for key, value in straight["weights"].items():
        torch.testing.assert_close(run["weights"][key], value, rtol=0, atol=1e-5, msg=f"{what}: {key}")
    for index, state in straight["optimizer"]["state"].items():
        for name in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(run["optimizer"]["state"][index][name], state[name], rtol=0, atol=1e-5,
                                       msg=f"{what}: AdamW {name} of parameter {index}")
    assert run["scheduler"] == straight["scheduler"], what
    assert [row[:2] for row in run["rows"]] == [row[:2] for row in rows], what
    for mine, theirs in zip(run["rows"], rows, strict=True):
        assert mine[2] == pytest.approx(theirs[2], abs=1e-5), f"{what}: logged {mine}, the straight run {theirs}"


@pytest.mark.timeout(120)
def test_a_mid_epoch_checkpoint_resumes_on_another_number_of_ranks_and_ends_as_the_straight_run(tmp_path):
    script = write_script(tmp_path, FIT, "fit.py")
    check_ok(run_script(script, str(tmp_path), "1", "straight1=-", timeout=60))  # writes straight1.ckpt at step 6
    saved = load_checkpoint(tmp_path / "straight1.ckpt")
    assert saved["loop"]["epoch"] == 1 and saved["loop"]["batches_done"] == 2 and not saved["loop"]["epoch_finished"]
    assert saved["train_order"] == {"kind": "shuffled", "seed": 0, "samples": 96, "drop_last": False}
    check_ok(run_script(script, str(tmp_path), "2", "straight2=-", f"1on2={tmp_path / 'straight1.ckpt'}",
                        nprocs=2, timeout=90))
    three = run_script(script, str(tmp_path), "3", f"2on3={tmp_path / 'straight2.ckpt'}", nprocs=3, timeout=90)
    check_ok(three)
    assert ("resuming epoch 1 at sample 48 of its order on 3 ranks x 8 (written on 2 ranks x 12): the same "
            "global batch") in three.output, three.output
    check_ok(run_script(script, str(tmp_path), "1", f"2on1={tmp_path / 'straight2.ckpt'}", timeout=60))

    straight = _load(tmp_path / "straight1.pt")
    # one order for any number of ranks: 2 ranks x 12 on shuffled data train as 1 process x 24
    _assert_same_end(_load(tmp_path / "straight2.pt"), straight, straight["rows"], "2 ranks, straight")
    for tag in ("2on1", "1on2", "2on3"):
        _assert_same_end(_load(tmp_path / f"{tag}.pt"), straight, _resumed_rows(straight["rows"]), tag)


def _own_order_fit(root, batch: int, ckpt: str | None = None) -> fw.Trainer:
    fw.seed_everything(0)
    trainer = fw.Trainer(devices=1, max_steps=3 if ckpt is None else -1, max_epochs=1, use_distributed_sampler=False,
                         default_root_dir=str(root), **workload.FIT_ARGS)
    trainer.fit(workload.Regressor(), DataLoader(workload.regression_data(64), batch_size=batch, shuffle=True),
                ckpt_path=ckpt)
    return trainer


def test_a_checkpoint_of_the_loaders_own_order_is_refused_mid_epoch_on_another_shape(tmp_path, capsys):
    own = tmp_path / "own.ckpt"
    _own_order_fit(tmp_path, 8).save_checkpoint(own)
    assert load_checkpoint(own)["train_order"] is None
    with pytest.raises(CheckpointError, match=r"after 3 batches per rank\) with 8 samples per batch per rank, and "
                                              r"this run's training batch size is 4: .* Resume with batch size 8"):
        _own_order_fit(tmp_path, 4, str(own))
    assert _own_order_fit(tmp_path, 8, str(own)).global_step == 8  # its own shape continues

    # the global order (the default) cannot continue the loader's own: one line through the CLI, nothing loaded
    recipe = tmp_path / "r.yaml"
    recipe.write_text("module:\n  _target_: distributed.workload.Regressor\ndata:\n  _target_: toy.ToyData\n"
                      "  n: 64\n  batch_size: 8\ntrainer:\n  max_epochs: 2\n  accelerator: cpu\n  devices: 1\n"
                      f"  default_root_dir: {tmp_path / 'cli'}\nlogger: false\n")
    capsys.readouterr()
    assert fw_main(["fit", str(recipe), f"ckpt_path={own}"]) == 1
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert last.startswith("fw: error: ckpt_path") and "Traceback" not in err, err
    assert "reading the training loader's own order" in last and "use_distributed_sampler=False" in last, last


def test_a_resume_with_nothing_left_of_its_epoch_reads_the_next_epoch_whole():
    """A mid-epoch checkpoint of the epoch's last batch, mapped onto another shape, starts its
    epoch's pass at the end: that pass is never read, and the next epoch reads its whole order."""
    from framework.data.global_order import GlobalOrderSampler

    sampler = GlobalOrderSampler(96, seed=0, shuffle=True, batch_size=16)
    sampler.set_epoch(0)
    sampler.start_at(96)
    assert len(sampler) == 0
    sampler.set_epoch(1)
    assert len(sampler) == 96 and sorted(sampler) == list(range(96))


@pytest.mark.procs  # no process, but two fits: out of the fast tier, which is at its limit
@pytest.mark.timeout(60)
def test_a_checkpoint_of_an_epochs_last_batch_resumed_on_another_shape_trains_the_next_epochs(tmp_path):
    """The checkpoint that the epoch's last ``on_train_batch_end`` writes (mid-epoch: the epoch's end
    has not run) resumed on another shape (here another batch size; the Ray elastic test found it
    on 2 ranks resumed on 1) once ended the fit there, every later epoch empty, as if done."""
    ckpt = tmp_path / "last_batch.ckpt"

    class SaveAfterTheLastBatch(fw.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if trainer.global_step == 4:  # 96 samples, 24 a batch: the epoch's last
                trainer.save_checkpoint(ckpt)

    fw.seed_everything(0)
    first = fw.Trainer(devices=1, max_epochs=1, callbacks=[SaveAfterTheLastBatch()], default_root_dir=str(tmp_path),
                       **workload.FIT_ARGS)
    first.fit(workload.Regressor(), DataLoader(workload.regression_data(96), batch_size=24, shuffle=True))
    saved = load_checkpoint(ckpt)
    assert saved["loop"]["batches_done"] == 4 and not saved["loop"]["epoch_finished"]
    resumed = fw.Trainer(devices=1, max_epochs=3, default_root_dir=str(tmp_path), **workload.FIT_ARGS)
    resumed.fit(workload.Regressor(), DataLoader(workload.regression_data(96), batch_size=12, shuffle=True),
                ckpt_path=str(ckpt))
    assert (resumed.global_step, resumed.current_epoch) == (4 + 2 * 8, 3)  # epochs 1 and 2: 8 batches of 12 each
