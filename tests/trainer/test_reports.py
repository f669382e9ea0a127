"""The lines a run writes at its start and end (``framework/trainer/reports.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
import forked
from helpers import check_ok, write_script

BOTH = """
import sys
import torch
import framework as fw
import parallel_lm

strategy = {"name": "model_parallel", "tensor_parallel_size": int(sys.argv[1])} if sys.argv[1] != "ddp" else "ddp_gloo"
trainer = fw.Trainer(**{**parallel_lm.QUIET, "logger": False}, devices=2, max_steps=1, strategy=strategy,
                     enable_checkpointing=False)
trainer.fit(parallel_lm.LM(), torch.utils.data.DataLoader(parallel_lm.data(16), batch_size=8))
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("strategy", "words"), [
    ("2", "batch 8 per device, global 8 (2 ranks share each batch)"),  # tensor parallel: one batch on both ranks
    ("1", "batch 8 per device, global 16 |"),  # model_parallel as 2 data-parallel replicas
    ("ddp", "batch 8 per device, global 16 |"),
])
def test_the_start_line_counts_the_global_batch_over_the_data_parallel_ranks(tmp_path, strategy, words):
    result = forked.run_script(write_script(tmp_path, BOTH), strategy, nprocs=2, timeout=90)
    check_ok(result)
    (line,) = [line for line in result.output.splitlines() if line.startswith("fw fit: strategy")]
    assert words in line, line
