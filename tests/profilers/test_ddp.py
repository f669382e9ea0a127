"""Under DDP every rank profiles its own process: each writes its own report, named with its rank
as Lightning names it (``fit-perf-0.txt``, ``fit-perf-1.txt``), counting its own batches."""

from __future__ import annotations

import re

import pytest
from distributed.helpers import check_ok, write_script
from forked import run_script

SCRIPT = """
import sys
import framework as fw
from framework.profilers import SimpleProfiler
from toy import LinearModel, loader, regression_data

trainer = fw.Trainer(accelerator="cpu", devices=2, strategy="ddp_gloo", max_epochs=1, logger=False,
                     enable_checkpointing=False, enable_progress_bar=False, default_root_dir=sys.argv[1],
                     profiler=SimpleProfiler(filename="perf"))
data = loader(regression_data(48), 4)  # 12 batches: 6 on each rank
trainer.fit(LinearModel(), data, data)
"""


def calls(report: str, action: str) -> int:
    return int(re.search(rf"^\|  {re.escape(action)}\s*\t\|  \S+\s*\t\|  (\d+)", report, re.MULTILINE).group(1))


@pytest.mark.timeout(60)
def test_every_rank_writes_its_own_report(tmp_path):
    root = tmp_path / "run"
    result = run_script(write_script(tmp_path, SCRIPT), str(root), nprocs=2, timeout=50)
    check_ok(result)
    assert "Profiler Report" not in result.output  # into the files, not the log
    assert sorted(p.name for p in root.glob("*.txt")) == ["fit-perf-0.txt", "fit-perf-1.txt"]
    for rank in (0, 1):
        report = (root / f"fit-perf-{rank}.txt").read_text()
        assert calls(report, "[_TrainingEpochLoop].train_dataloader_next") == 6
        assert calls(report, "[Strategy]DDPStrategy.training_step") == calls(report, "[Strategy]DDPStrategy.backward") == 6
        assert calls(report, "[_EvaluationLoop].val_next") == 2 + 6  # the sanity check's 2, then its shard
