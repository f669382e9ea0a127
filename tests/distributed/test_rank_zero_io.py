"""Property 5: with a ModelCheckpoint, a TensorBoardLogger and a CSVLogger, only rank 0 writes,
and the 2-rank job finishes (no rank waits forever for rank 0's I/O)."""

from __future__ import annotations

import json

import pytest
from forked import run_script

from framework.checkpointing.file import load_checkpoint

from .helpers import check_ok, write_script

SCRIPT = """
import json, os, sys
from torch.utils.data import DataLoader
import framework as fw
import framework.checkpointing.file as ckpt
from framework.callbacks import ModelCheckpoint
from framework.loggers import CSVLogger, Logger, TensorBoardLogger
import workload

root = sys.argv[1]
writes = []  # what this rank wrote, recorded at the two doors every write goes through

real_save = ckpt.atomic_save
def recording_save(obj, path):
    writes.append(("checkpoint", str(path)))
    return real_save(obj, path)
ckpt.atomic_save = recording_save

for cls in (TensorBoardLogger, CSVLogger):
    for name in ("log_metrics", "log_hyperparams"):
        real = getattr(cls, name)
        def recording(self, *args, _real=real, _name=f"{cls.__name__}.{name}", **kwargs):
            writes.append((_name, ""))
            return _real(self, *args, **kwargs)
        setattr(cls, name, recording)

class Logged(workload.IndexRecorder):
    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.log("train/loss", loss, on_epoch=True)
        return loss

fw.seed_everything(0)
trainer = fw.Trainer(
    accelerator="cpu", devices=2, strategy="ddp_gloo", max_epochs=2, log_every_n_steps=1,
    default_root_dir=root, enable_progress_bar=False, num_sanity_val_steps=0,
    callbacks=[ModelCheckpoint(save_last=True)], logger=[TensorBoardLogger(), CSVLogger()],
)
trainer.fit(Logged(), train_dataloaders=DataLoader(workload.IndexData(16), batch_size=4))
with open(f"{root}/writes_rank{trainer.global_rank}.json", "w") as f:
    json.dump({"writes": writes, "log_dir": trainer.log_dir}, f)
sys.stdout.flush()
"""


@pytest.mark.timeout(45)
def test_only_rank_zero_writes_and_nobody_hangs(tmp_path):
    root = tmp_path / "run"
    root.mkdir()
    check_ok(run_script(write_script(tmp_path, SCRIPT), str(root), nprocs=2, timeout=30))
    rank0 = json.loads((root / "writes_rank0.json").read_text())
    rank1 = json.loads((root / "writes_rank1.json").read_text())
    assert rank1["writes"] == [], f"rank 1 wrote: {rank1['writes']}"
    kinds = {kind for kind, _ in rank0["writes"]}
    assert {"checkpoint", "TensorBoardLogger.log_metrics", "CSVLogger.log_metrics"} <= kinds, kinds
    assert rank0["log_dir"] == rank1["log_dir"], "ranks disagree on the log folder"

    # one version folder (both loggers share it), and the checkpoints rank 0 wrote load
    versions = sorted(p.relative_to(root).as_posix() for p in root.glob("*/version_*"))
    assert versions == ["fw_logs/version_0"], versions
    ckpts = sorted(root.rglob("*.ckpt"))
    assert sorted(p.name for p in ckpts) == ["epoch=1-step=4.ckpt", "last.ckpt"], ckpts
    for path in ckpts:
        state = load_checkpoint(path)
        assert state["world_size"] == 2 and state["epoch"] in (0, 1)
    assert load_checkpoint(next(p for p in ckpts if p.name == "last.ckpt"))["global_step"] == 4
    assert {path for _, path in rank0["writes"] if path} >= {str(p) for p in ckpts}
