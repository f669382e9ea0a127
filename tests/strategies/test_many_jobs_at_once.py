"""Jobs started at the same moment on one machine each get their own rendezvous port: fw's
launcher lets torch's agent bind the port it uses (``127.0.0.1:0``, as ``torchrun
--standalone``), and ``ddp_spawn`` holds its store's port from bind to end, so no job can take
another's port between a probe and its use (the race a probe-and-release launcher has)."""

from __future__ import annotations

import concurrent.futures

import pytest
from distributed.helpers import PYTHON, clean_env, run_cmd, write_script

SCRIPT = """
import sys
from torch.utils.data import DataLoader
import framework as fw
from workload import Regressor, regression_data

if __name__ == "__main__":  # ddp_spawn's workers import this file
    strategy = sys.argv[1]
    fw.seed_everything(0)
    trainer = fw.Trainer(accelerator="cpu", devices=2, strategy=strategy, max_epochs=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Regressor(), DataLoader(regression_data(), batch_size=8))
    if trainer.is_global_zero:
        print(f"DONE {strategy} step={trainer.global_step}", flush=True)
"""


@pytest.mark.procs
@pytest.mark.timeout(150)
def test_four_two_rank_jobs_started_at_once_all_train(tmp_path):
    script = write_script(tmp_path, SCRIPT)
    strategies = ["ddp", "ddp", "ddp_spawn", "ddp_spawn"]
    with concurrent.futures.ThreadPoolExecutor(len(strategies)) as pool:
        results = list(pool.map(lambda s: run_cmd([PYTHON, str(script), s], timeout=200, env=clean_env()),
                                strategies))
    for strategy, result in zip(strategies, results, strict=True):
        assert result.returncode == 0, f"{strategy}:\n{result.output}"
        assert f"DONE {strategy} step=" in result.output, result.output
