"""The GPT recipe (``conf/gpt/*.yaml``) as a user runs it: ``fw fit`` on this Python's standard
library source, the validation loss falling, ``fw predict`` printing the text the model
continues, throughput in tokens per second per device; the ``model_parallel`` recipe (tensor
parallel with loss parallel, 2 ranks through fw's launcher) ends where the one-process recipe ends.
Short runs: the recipes' own lengths are for users."""

from __future__ import annotations

import csv
import math
import re
import subprocess

import pytest

from distributed.helpers import FW, REPO, clean_env, run_cmd

SHORT = ["trainer.max_steps=12", "trainer.val_check_interval=6", "trainer.limit_val_batches=2",
         "data.max_bytes=150000", "trainer.log_every_n_steps=2", "module.warmup_steps=5", "trainer.enable_progress_bar=false", "logger=false"]


def final_metrics(output: str) -> dict[str, float]:
    (line,) = [line for line in output.splitlines() if line.startswith("fw: final metrics: ")]
    return {k: float(v) for k, v in re.findall(r"([\w/.-]+)=([-\d.e+]+)", line)}


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpt")
    cache = f"data.cache_dir={root / 'cache'}"
    fit = run_cmd([FW, "fit", "conf/gpt/cpu.yaml", *SHORT, cache, f"trainer.default_root_dir={root}",
                   "logger={_target_: framework.loggers.CSVLogger}"], timeout=240, env=clean_env())
    return fit, root, cache


@pytest.mark.timeout(300)
def test_the_gpt_recipe_learns_python_and_predict_prints_a_continuation(one_process):
    fit, root, cache = one_process
    assert fit.returncode == 0, fit.output
    (metrics_csv,) = root.glob("**/metrics.csv")
    rows = list(csv.DictReader(metrics_csv.open()))
    val = [float(r["val/loss"]) for r in rows if r.get("val/loss")]
    assert len(val) == 2 and val[1] < val[0] < math.log(256), val  # from a uniform guess over bytes, falling
    tokens = [float(r["throughput/tokens_per_sec_per_device"]) for r in rows if r.get("throughput/tokens_per_sec_per_device")]
    assert tokens and all(t > 0 for t in tokens)
    assert "fw: throughput:" in fit.output and "tokens/s per device" in fit.output
    predict = subprocess.run([FW, "predict", "conf/gpt/cpu.yaml", "ckpt_path=last", cache, f"trainer.default_root_dir={root}",
                              "module.max_new_tokens=40", "trainer.enable_progress_bar=false"],
                             capture_output=True, text=True, timeout=120, env=clean_env(), cwd=REPO)
    assert predict.returncode == 0, predict.stderr
    assert predict.stdout.startswith("def ") and len(predict.stdout.encode()) >= 40, predict.stdout  # on stdout alone


@pytest.mark.timeout(300)
def test_the_model_parallel_recipe_ends_where_the_one_process_recipe_ends(one_process, tmp_path):
    fit, root, cache = one_process
    assert fit.returncode == 0, fit.output
    split = run_cmd([FW, "fit", "conf/gpt/model_parallel.yaml", *SHORT, cache, f"trainer.default_root_dir={tmp_path}",
                     "module.loss_parallel=true"], timeout=240, env=clean_env())
    assert split.returncode == 0, split.output
    single, parallel = final_metrics(fit.output), final_metrics(split.output)
    assert parallel["val/loss"] == pytest.approx(single["val/loss"], abs=1e-3), (single, parallel)
