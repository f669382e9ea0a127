"""What a newcomer meets (issue 10): stdout holds only what a command was asked to print, library
messages are one line each on stderr, a fit says where its logs and checkpoints went, fw's
warnings are one line naming the fix, and CPU settings that would run silently wrong are refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, subprocess_env
from forked import fw_command

import framework as fw
from framework.errors import ConfigError

FW = str(Path(sys.executable).parent / "fw")


@pytest.mark.timeout(45)
def test_fw_fit_prints_its_results_on_stdout_and_everything_else_on_stderr(tmp_path):
    proc = subprocess.run([FW, "fit", str(ROOT / "conf" / "regression.yaml"), "trainer.enable_progress_bar=false",
                           "trainer.max_epochs=2", f"trainer.default_root_dir={tmp_path}"],
                          env=subprocess_env(), capture_output=True, text=True, timeout=100, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("fw: final metrics: "), proc.stdout
    assert "fw fit: strategy single" in proc.stderr
    done = [line for line in proc.stderr.splitlines() if line.startswith("fw fit: done at step")]
    assert done and "logs in " in done[0], proc.stderr
    assert "best checkpoint" in done[0] and str(tmp_path) in done[0]


def test_the_final_metrics_line_names_each_value_once(tmp_path):
    proc = fw_command("fit", str(ROOT / "conf" / "digits.yaml"), "trainer.enable_progress_bar=false",
                           "trainer.max_epochs=1", f"trainer.default_root_dir={tmp_path}", cwd=ROOT, env=subprocess_env())
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.strip()
    assert "train/loss_epoch=" in line and "train/loss=" not in line and "train/loss_step=" not in line, line


WARNS = """
import sys
sys.path.insert(0, {tests!r})
import framework as fw
from toy import LinearModel, loader, regression_data

class NoVal(LinearModel):
    validation_step = fw.TrainModule.validation_step

fw.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False).fit(
    NoVal(), loader(regression_data(16), 8), loader(regression_data(8), 8))
"""


def test_fws_warnings_are_one_line_on_stderr(tmp_path):
    script = tmp_path / "warns.py"
    script.write_text(WARNS.format(tests=str(ROOT / "tests")))
    proc = subprocess.run([sys.executable, str(script)], env=subprocess_env(), capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    lines = [line for line in proc.stderr.splitlines() if "validation_step" in line]
    assert lines == ["fw: warning: validation data was given but NoVal has no validation_step: fit skips "
                     "validation (define validation_step to validate)"], proc.stderr
    assert "UserWarning" not in proc.stderr and "warnings.warn" not in proc.stderr


def test_dp_with_several_devices_on_the_cpu_is_refused_not_run_on_one():
    with pytest.raises(ConfigError, match=r"strategy=dp with trainer.devices=2 needs GPUs.*ddp_gloo"):
        fw.Trainer(accelerator="cpu", devices=2, strategy="dp")


def test_fw_env_reports_the_mpi_strategy_fw_can_run():
    import importlib.util

    proc = fw_command("env", cwd=ROOT, env=subprocess_env())
    row = next(line for line in proc.stdout.splitlines() if "backends" in line)
    if importlib.util.find_spec("mpi4py"):
        assert "mpi=yes" in row, row
    else:
        assert f"mpi=no (pip install -e '{ROOT}[mpi]')" in row, row  # fw runs from this clone


@pytest.mark.parametrize(("extra", "warned"), [([], True), (["ckpt_path=none"], False)])
def test_validate_without_a_checkpoint_says_the_weights_are_fresh_unless_asked(tmp_path, extra, warned):
    proc = fw_command("validate", str(ROOT / "conf" / "regression.yaml"), "trainer.enable_progress_bar=false",
                           f"trainer.default_root_dir={tmp_path}", *extra, cwd=ROOT, env=subprocess_env())
    assert proc.returncode == 0, proc.stderr
    line = "fw: warning: fw validate without ckpt_path scores freshly initialised weights"
    assert (line in proc.stderr) is warned, proc.stderr


NO_SKLEARN = """
import builtins, importlib.util, sys
real, real_find_spec = builtins.__import__, importlib.util.find_spec
def without_sklearn(name, *args, **kwargs):
    if name.split(".")[0] == "sklearn":
        raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
    return real(name, *args, **kwargs)
def find_spec_without_sklearn(name, *args, **kwargs):  # as for a package that is not installed
    return None if name.split(".")[0] == "sklearn" else real_find_spec(name, *args, **kwargs)
builtins.__import__, importlib.util.find_spec = without_sklearn, find_spec_without_sklearn
from framework.cli import main
sys.exit(main({argv!r}))
"""


def test_a_missing_optional_package_is_one_line_naming_the_extra(tmp_path):
    script = tmp_path / "no_sklearn.py"
    argv = ["fit", str(ROOT / "conf" / "digits.yaml"), "trainer.enable_progress_bar=false",
            f"trainer.default_root_dir={tmp_path}"]
    script.write_text(NO_SKLEARN.format(argv=argv))
    proc = subprocess.run([sys.executable, str(script)], env=subprocess_env(), capture_output=True, text=True,
                          timeout=100, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "fw: error: this run needs scikit-learn (module 'sklearn'), which is not installed: "
        "pip install -e '.[recipes]' (or pip install scikit-learn)")  # fw runs from its clone here (cwd)
    assert "Traceback" not in proc.stderr


@pytest.mark.timeout(45)
def test_a_version_pinned_in_the_recipe_keeps_every_run_in_one_folder(tmp_path):
    """``logger.version`` in the recipe: the README's paths hold for every run, not just the first."""
    for _ in range(2):
        proc = fw_command("fit", str(ROOT / "conf" / "regression.yaml"), "trainer.enable_progress_bar=false",
                               "trainer.max_epochs=1", f"trainer.default_root_dir={tmp_path}", "logger.version=0", cwd=ROOT, env=subprocess_env())
        assert proc.returncode == 0, proc.stderr
    versions = sorted(p.name for p in (tmp_path / "fw_logs").iterdir())
    assert versions == ["version_0"], versions


@pytest.mark.parametrize(("args", "code", "message"), [
    (["fit", "trainer.logger=false"], 2, "'trainer.logger' is a top-level key of the recipe: write logger=..."),
    (["validate", "ckpt_path=last"], 1, "ckpt_path='last': no checkpoint under"),
])
def test_newcomer_mistakes_are_one_line_with_the_fix(tmp_path, args, code, message):
    stage, *rest = args
    proc = fw_command(stage, str(ROOT / "conf" / "regression.yaml"), "trainer.enable_progress_bar=false",
                      f"trainer.default_root_dir={tmp_path}", *rest, cwd=ROOT, env=subprocess_env())
    assert proc.returncode == code, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("fw: error: ") and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
