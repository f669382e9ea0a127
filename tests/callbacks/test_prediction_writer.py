"""PredictionWriter: predictions in files, every rank's gathered in the data's order, and
``fw predict`` writing them into the run directory and saying where."""

from __future__ import annotations

import csv

import pytest
import torch
from conftest import ROOT, subprocess_env
from forked import fw_command
from torch.utils.data import DataLoader, TensorDataset

import framework as fw
from framework.callbacks import PredictionWriter

QUIET = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)


class Doubler(fw.TrainModule):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(1))

    def predict_step(self, batch, batch_idx):
        (x,) = batch
        return torch.stack([x * 2 * self.w, x], dim=1)  # [batch, 2]: the prediction and its input


def _data(n: int = 10) -> DataLoader:
    return DataLoader(TensorDataset(torch.arange(n, dtype=torch.float32)), batch_size=3)


def test_epoch_file_holds_every_prediction_in_order_and_csv_rows(tmp_path):
    pt = PredictionWriter(output_dir=str(tmp_path))
    returned = fw.Trainer(callbacks=[pt], **QUIET).predict(Doubler(), _data())
    saved = torch.load(tmp_path / "predictions.pt")
    assert torch.equal(saved, torch.cat(returned)) and saved.shape == (10, 2) and pt.written.endswith("predictions.pt")
    fw.Trainer(callbacks=[PredictionWriter(output_dir=str(tmp_path), format="csv")], **QUIET).predict(Doubler(), _data())
    rows = list(csv.reader((tmp_path / "predictions.csv").open()))
    assert len(rows) == 10 and rows[3] == ["0", "3", "6.0", "3.0"]


def test_batch_interval_writes_each_batch_as_it_goes(tmp_path):
    fw.Trainer(callbacks=[PredictionWriter(output_dir=str(tmp_path), write_interval="batch")], **QUIET).predict(
        Doubler(), _data())
    files = sorted((tmp_path / "batches").glob("*.pt"))
    assert [f.name for f in files] == [f"rank0_loader0_batch{i}.pt" for i in range(4)]
    last = torch.load(files[-1])
    assert last["batch_indices"] == [9] and torch.equal(last["prediction"], torch.tensor([[18.0, 9.0]]))
    assert not (tmp_path / "predictions.pt").exists()


DDP = """
import sys, torch
sys.path.insert(0, {tests!r})
import framework as fw
from framework.callbacks import PredictionWriter
from callbacks.test_prediction_writer import Doubler, _data
trainer = fw.Trainer(accelerator="cpu", devices=2, strategy="ddp_gloo", logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, callbacks=[PredictionWriter(output_dir=sys.argv[1])])
trainer.predict(Doubler(), _data())
"""


@pytest.mark.timeout(45)
def test_two_ranks_predictions_are_gathered_in_the_datas_order(tmp_path):
    from forked import run_script

    script = tmp_path / "ddp.py"
    script.write_text(DDP.format(tests=str(ROOT / "tests")))
    result = run_script(script, str(tmp_path), nprocs=2, timeout=30, env=subprocess_env())
    assert result.returncode == 0, result.output
    saved = torch.load(tmp_path / "predictions.pt")
    assert torch.equal(saved[:, 1], torch.arange(10, dtype=torch.float32))  # every sample once, in order
    assert torch.equal(saved[:, 0], 2 * saved[:, 1])
    assert f"fw predict: wrote 10 predictions to {tmp_path}/predictions.pt" in result.output


@pytest.mark.timeout(60)
def test_fw_predict_writes_into_the_run_directory_and_says_where(tmp_path):
    common = [str(ROOT / "conf" / "digits.yaml"), "trainer.enable_progress_bar=false", "trainer.max_epochs=1",
              f"trainer.default_root_dir={tmp_path}"]
    for stage in (["fit"], ["predict", "ckpt_path=last"]):
        proc = fw_command(stage[0], *common, *stage[1:], cwd=tmp_path, env=subprocess_env())
        assert proc.returncode == 0, proc.stderr
    wrote = [line for line in proc.stderr.splitlines() if line.startswith("fw predict: wrote ")]
    assert wrote and wrote[0].endswith("version_1/predictions.pt"), proc.stderr  # its own run folder, beside the fit's
    path = wrote[0].split(" to ", 1)[1]
    assert torch.load(path if path.startswith("/") else tmp_path / path).shape == (359,)
