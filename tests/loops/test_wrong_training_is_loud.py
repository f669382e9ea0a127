"""Training that goes wrong stops loudly instead of exiting 0: a non-finite loss (by default an
error naming the step; ``on_nonfinite=skip`` or ``warn`` on request), weights that turned
non-finite never overwrite a checkpoint, a training_step that returns None on every batch, an
empty training set, and limits that leave no batch."""

from __future__ import annotations

import os

import pytest
import torch
from conftest import subprocess_env
from torch.utils.data import DataLoader, TensorDataset
from toy import QUIET, LinearModel, loader, regression_data

import framework as fw
from framework.callbacks import ModelCheckpoint
from framework.errors import ConfigError, TrainingError


class NaNAt(LinearModel):
    """The loss turns NaN at one global step (counting from 1)."""

    def __init__(self, step: int):
        super().__init__()
        self.bad_step = step

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        return loss * float("nan") if self.global_step + 1 == self.bad_step else loss


def test_a_nan_loss_stops_the_run_naming_the_step_and_keeps_the_checkpoints(tmp_path):
    ckpt = ModelCheckpoint(dirpath=tmp_path, save_top_k=-1, every_n_train_steps=1)
    trainer = fw.Trainer(**{**QUIET, "enable_checkpointing": True}, max_epochs=3, callbacks=[ckpt])
    with pytest.raises(TrainingError, match=r"loss is nan at step 6 \(epoch 1, batch 0\)"):
        trainer.fit(NaNAt(6), loader(regression_data(40), 8))
    saved = sorted(name for name in os.listdir(tmp_path) if not name.startswith("."))  # not the index
    assert saved == [f"epoch={e}-step={s}.ckpt" for e, s in ((0, 1), (0, 2), (0, 3), (0, 4), (0, 5))]
    from framework.checkpointing.file import load_checkpoint

    weights = load_checkpoint(tmp_path / "epoch=0-step=5.ckpt")["state_dict"]
    assert all(torch.isfinite(w).all() for w in weights.values())


def test_skip_drops_the_step_and_warn_goes_on():
    model = NaNAt(3)
    trainer = fw.Trainer(**QUIET, max_epochs=1, on_nonfinite="skip")
    with pytest.warns(UserWarning, match="non-finite loss at step 3.*step skipped"):
        trainer.fit(model, loader(regression_data(40), 8))
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert trainer.global_step == 5

    trainer = fw.Trainer(**QUIET, max_epochs=1, on_nonfinite="warn")
    with pytest.warns(UserWarning, match="training on"):
        trainer.fit(NaNAt(3), loader(regression_data(40), 8))


def test_non_finite_weights_are_never_written(tmp_path):
    good = tmp_path / "good.ckpt"
    trainer = fw.Trainer(**QUIET, max_steps=1)
    model = LinearModel()
    trainer.fit(model, loader(regression_data(40), 8))
    trainer.save_checkpoint(good)
    before = good.read_bytes()
    with torch.no_grad():  # as a finite loss with a NaN gradient would leave them
        model.net.weight.fill_(float("nan"))
    with pytest.raises(TrainingError, match=r"weights are not finite.*was not written"):
        trainer.save_checkpoint(good)
    assert good.read_bytes() == before


def test_a_training_step_that_always_returns_none_is_an_error():
    class Nothing(LinearModel):
        def training_step(self, batch, batch_idx):
            return None

    with pytest.raises(TrainingError, match="returned None for all 5 batches of epoch 0"):
        fw.Trainer(**QUIET, max_epochs=2).fit(Nothing(), loader(regression_data(40), 8))


def test_an_empty_training_set_is_an_error_shuffled_or_not():
    empty = TensorDataset(torch.zeros(0, 4), torch.zeros(0, 1))
    with pytest.raises(TrainingError, match="training data has no batches \\(0 samples"):
        fw.Trainer(**QUIET).fit(LinearModel(), DataLoader(empty, batch_size=4))

    class EmptyData(fw.DataModule):
        def train_dataloader(self):
            return DataLoader(empty, batch_size=4, shuffle=True)

    with pytest.raises(ConfigError, match=r"EmptyData.train_dataloader\(\): the data set is empty"):
        fw.Trainer(**QUIET).fit(LinearModel(), datamodule=EmptyData())


def test_limits_that_leave_no_batch_warn():
    with pytest.warns(UserWarning, match="limit_train_batches=0 leaves 0 training batches"):
        fw.Trainer(**QUIET, max_epochs=1, limit_train_batches=0).fit(LinearModel(), loader(regression_data(16), 8))


def test_the_cli_prints_one_line_and_exits_1(tmp_path):
    (tmp_path / "nanmodel.py").write_text(
        f"import sys\nsys.path.insert(0, {os.path.dirname(__file__) + '/..'!r})\nfrom toy import LinearModel\n"
        "class NaN(LinearModel):\n"
        "    def training_step(self, batch, batch_idx):\n"
        "        return super().training_step(batch, batch_idx) * float('nan')\n"
        "import framework as fw\nfrom toy import regression_data, loader\n"
        "class Data(fw.DataModule):\n"
        "    def train_dataloader(self):\n        return loader(regression_data(16), 8)\n"
    )
    (tmp_path / "r.yaml").write_text("module: {_target_: nanmodel.NaN}\ndata: {_target_: nanmodel.Data}\n"
                                     "trainer: {max_epochs: 1, accelerator: cpu, enable_progress_bar: false}\nlogger: false\n")
    from forked import fw_command

    proc = fw_command("fit", "r.yaml", cwd=tmp_path, env=subprocess_env())
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].startswith("fw: error: the loss is nan at step 1")
    assert "Traceback" not in proc.stderr


DDP_SKIP = """
import json, sys
import torch
from torch.utils.data import DataLoader
import framework as fw
import workload

class NaNOnRank1(workload.Regressor):
    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        bad = self.global_rank == 1 and self.global_step + 1 == 3
        return loss * float("nan") if bad else loss

fw.seed_everything(0)
model = NaNOnRank1()
trainer = fw.Trainer(devices=2, strategy="ddp_gloo", max_epochs=2, on_nonfinite="skip", **workload.FIT_ARGS)
trainer.fit(model, DataLoader(workload.regression_data(32), batch_size=4))
with open(f"{sys.argv[1]}/rank{trainer.global_rank}.json", "w") as f:
    json.dump({"step": trainer.global_step, "w": torch.cat([p.flatten() for p in model.parameters()]).tolist()}, f)
"""


@pytest.mark.timeout(45)
def test_skip_under_ddp_drops_the_step_on_every_rank(tmp_path):
    import json
    import math

    from distributed.helpers import check_ok, write_script
    from forked import run_script

    check_ok(run_script(write_script(tmp_path, DDP_SKIP), str(tmp_path), nprocs=2, timeout=30))
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["w"] == r1["w"] and all(math.isfinite(v) for v in r0["w"])
    assert r0["step"] == r1["step"] == 8


def test_a_dict_without_loss_and_a_model_that_is_not_a_train_module_say_so():
    class NoLoss(LinearModel):
        def training_step(self, batch, batch_idx):
            return {"out": super().training_step(batch, batch_idx)}

    with pytest.raises(TrainingError, match=r"returned a dict without 'loss' \(keys: out\)"):
        fw.Trainer(**QUIET, max_epochs=1).fit(NoLoss(), loader(regression_data(16), 8))
    with pytest.raises(ConfigError, match=r"the model is a torch.nn.modules.linear.Linear, not a TrainModule"):
        fw.Trainer(**QUIET, max_epochs=1).fit(torch.nn.Linear(4, 1), loader(regression_data(16), 8))


def test_on_an_accelerator_losses_are_read_in_batches_and_the_first_bad_step_is_named(monkeypatch):
    from framework.loops import nonfinite as optimization

    seen = []

    class Counts(NaNAt):
        def training_step(self, batch, batch_idx):
            seen.append(self.global_step + 1)
            return super().training_step(batch, batch_idx)

    monkeypatch.setattr(optimization, "checks_later", lambda device: True)  # as on a GPU
    monkeypatch.setattr(optimization, "CHECK_EVERY_ON_ACCELERATORS", 4)
    with pytest.raises(TrainingError, match=r"loss is nan at step 6 \(epoch 1, batch 0\)"):
        fw.Trainer(**QUIET, max_epochs=3).fit(Counts(6), loader(regression_data(40), 8))
    assert seen[-1] == 9  # read together with steps 6-9 (step 5 ended epoch 0), not at step 6 itself
    with pytest.warns(UserWarning, match="non-finite loss at step 3"):  # the epoch's end reads the rest
        fw.Trainer(**QUIET, max_epochs=1, on_nonfinite="warn").fit(NaNAt(3), loader(regression_data(40), 8))
