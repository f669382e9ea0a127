"""The GPU GPT recipe (issue 19, item 6): ``conf/gpt/gpu.yaml`` (128 M parameters, bf16-mixed,
compiled, fused AdamW) trained for a short while on one GPU reports its tokens per second per
device and its MFU against the GPU's bf16 peak (fw bench's table). Without a GPU it skips with
the reason; on the GPU machine the figures go into benchmarks/results/gpu-tests-*.txt."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT, subprocess_env

pytestmark = pytest.mark.gpu
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.skipif(GPUS < 1, reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
@pytest.mark.timeout(600)
def test_the_gpu_gpt_recipe_reports_tokens_per_second_and_mfu(tmp_path):
    fw = str(Path(sys.executable).parent / "fw")
    cmd = [fw, "fit", "conf/gpt/gpu.yaml", "trainer.max_steps=150", "trainer.val_check_interval=150",
           "trainer.limit_val_batches=2", f"trainer.default_root_dir={tmp_path}", "trainer.enable_progress_bar=false",
           "logger=false", "trainer.enable_checkpointing=false", "callbacks=[{_target_: framework.callbacks.ThroughputMonitor}]"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=580, cwd=ROOT, env=subprocess_env())
    assert proc.returncode == 0, proc.stderr[-4000:]
    (line,) = [line for line in proc.stderr.splitlines() if line.startswith("fw: throughput:")]
    print(line)
    mfu = re.search(r"MFU ([\d.]+) %", line)
    assert mfu is not None, line  # the GPU is in the peak table and the run is bf16
    assert 0 < float(mfu.group(1)) < 100
