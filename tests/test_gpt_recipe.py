"""The GPT recipe (``conf/gpt/*.yaml``) as a user runs it: ``fw fit`` on this Python's standard
library source, the validation loss falling, ``fw predict`` printing the text the model
continues, throughput in tokens per second per device; the ``model_parallel`` recipe (tensor
parallel with loss parallel, 2 ranks) ends where the one-process recipe ends. Short runs: the
recipes' own lengths are for users. The commands run in copies forked from the test process
(tests/forked.py: ``framework.cli.main`` as the installed ``fw`` runs it; the 2 ranks with the
variables torchrun gives its workers); fw's launcher itself is tested in tests/distributed."""

from __future__ import annotations

import csv
import math
import re

import forked
import pytest
from distributed.helpers import REPO, clean_env

SHORT = ["trainer.max_steps=12", "data.batch_size=8", "trainer.val_check_interval=6", "trainer.limit_val_batches=2",
         "data.max_bytes=150000", "trainer.log_every_n_steps=2", "module.warmup_steps=5", "trainer.enable_progress_bar=false", "logger=false"]


def final_metrics(output: str) -> dict[str, float]:
    (line,) = [line for line in output.splitlines() if line.startswith("fw: final metrics: ")]
    return {k: float(v) for k, v in re.findall(r"([\w/.-]+)=([-\d.e+]+)", line)}


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpt")
    cache = f"data.cache_dir={root / 'cache'}"
    fit = forked.fw_command("fit", "conf/gpt/cpu.yaml", *SHORT, cache, f"trainer.default_root_dir={root}",
                            "logger={_target_: framework.loggers.CSVLogger}", cwd=REPO, env=clean_env(), timeout=240)
    return fit, root, cache


@pytest.mark.timeout(300)
def test_the_gpt_recipe_learns_python_and_predict_prints_a_continuation(one_process):
    fit, root, cache = one_process
    assert fit.returncode == 0, fit.stderr
    (metrics_csv,) = root.glob("**/metrics.csv")
    rows = list(csv.DictReader(metrics_csv.open()))
    val = [float(r["val/loss"]) for r in rows if r.get("val/loss")]
    assert len(val) == 2 and val[1] < val[0] < math.log(256), val  # from a uniform guess over bytes, falling
    tokens = [float(r["throughput/tokens_per_sec_per_device"]) for r in rows if r.get("throughput/tokens_per_sec_per_device")]
    assert tokens and all(t > 0 for t in tokens)
    assert "fw: throughput:" in fit.stderr and "tokens/s per device" in fit.stderr
    predict = forked.fw_command("predict", "conf/gpt/cpu.yaml", "ckpt_path=last", cache, f"trainer.default_root_dir={root}",
                                "module.max_new_tokens=40", "trainer.enable_progress_bar=false", cwd=REPO, env=clean_env(),
                                timeout=120)
    assert predict.returncode == 0, predict.stderr
    assert predict.stdout.startswith("def ") and len(predict.stdout.encode()) >= 40, predict.stdout  # on stdout alone


@pytest.mark.timeout(300)
def test_the_model_parallel_recipe_ends_where_the_one_process_recipe_ends(one_process, tmp_path):
    fit, _, cache = one_process
    assert fit.returncode == 0, fit.stderr
    split = forked.fw_command("fit", "conf/gpt/model_parallel.yaml", *SHORT, cache, f"trainer.default_root_dir={tmp_path}",
                              "module.loss_parallel=true", cwd=REPO, env=clean_env(), timeout=240, nprocs=2)
    assert split.returncode == 0, split.stderr
    single, parallel = final_metrics(fit.stdout + fit.stderr), final_metrics(split.stdout + split.stderr)
    assert parallel["val/loss"] == pytest.approx(single["val/loss"], abs=1e-3), (single, parallel)
