"""``fw`` from a shell: one-line errors with exit codes, tracebacks kept for user code, and the
README's main job reaching its accuracy bar."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, subprocess_env
from forked import fw_command


def fw(*args: str, cwd: Path = ROOT, timeout: int = 120) -> subprocess.CompletedProcess:
    """``fw ARGS`` in a forked copy of this process (tests/forked.py: the imports are paid once);
    the installed command itself is README.md's (tests/test_readme.py, .ci/run)."""
    return fw_command(*args, cwd=cwd, env=subprocess_env(), timeout=timeout)


@pytest.mark.parametrize("args,code,pattern", [
    (["fit", "conf/nope.yaml"], 2, "recipe 'conf/nope.yaml' does not exist"),
    (["fitt", "conf/digits.yaml"], 2, "invalid choice: 'fitt'"),
    (["fit", "conf/digits.yaml", "trainer.max_epochs"], 2, "has no '='"),
    (["fit", "conf/digits.yaml", "trainer.strategy=ddpp"], 2, r"unknown strategy 'ddpp'.*known: .*ddp_gloo"),
    (["fit", "conf/digits.yaml", "trainer.accelerator=tpu"], 2, "unknown accelerator 'tpu'"),
    (["fit", "conf/digits.yaml", "trainer.precision=65"], 2, "unknown precision '65'"),
    (["fit", "conf/digits.yaml", "trainer.accelerator=cuda"], 2, "CUDA is not available"),
    (["fit", "conf/digits.yaml", "trainer.strategy=ddp_nccl"], 2, "ddp_nccl needs CUDA"),
    (["fit", "conf/digits.yaml", "module._target_=recipes.digits.Nope"], 2, "has no 'Nope'"),
    (["fit", "conf/digits.yaml", "module.hiden=3"], 2, "unknown argument 'hiden'"),
    (["fit", "conf/digits.yaml", "trainer.devices=2", "trainer.strategy=ddp_gloo",
      "trainer.strategy.socket_ifname=nosuch0"], 2, "interface 'nosuch0' does not exist"),
    (["fit", "conf/digits.yaml", "trainer.devices=2", "trainer.strategy=ddp_gloo",
      "trainer.strategy.init_method=file:///nonexistent-dir/rdzv"], 2, "directory /nonexistent-dir does not exist"),
    (["fit", "conf/digits.yaml", "trainer.devices=2", "trainer.strategy=mpi"], 2, "needs an MPI launcher: mpiexec -n 2"),
    (["fit", "conf/digits.yaml", "ckpt_path=/nonexistent.ckpt", "trainer.default_root_dir=."], 1,
     "checkpoint '/nonexistent.ckpt' does not exist"),
])
@pytest.mark.timeout(20)
def test_user_mistakes_are_one_line_errors(args, code, pattern, tmp_path):
    proc = fw_command(*args, cwd=ROOT, env=subprocess_env())  # the command's main(), in a fork of this process
    assert proc.returncode == code, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("fw: error:"), proc.stderr
    assert re.search(pattern, lines[-1]), lines[-1]
    assert "Traceback" not in proc.stderr


@pytest.mark.timeout(60)
def test_error_in_user_code_keeps_its_traceback(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("module:\n  _target_: toy.RaisesInStep\ndata:\n  _target_: toy.ToyData\n"
                      f"trainer:\n  max_epochs: 1\n  accelerator: cpu\n  default_root_dir: {tmp_path}\nlogger: false\n")
    proc = fw("fit", str(recipe))
    assert proc.returncode == 1
    assert "Traceback" in proc.stderr and "ZeroDivisionError: user code failed here" in proc.stderr
    assert "in training_step" in proc.stderr


@pytest.mark.timeout(30)
def test_print_config_shows_the_merged_recipe():
    proc = fw("fit", "conf/digits.yaml", "trainer.max_epochs=7", "--print-config")
    assert proc.returncode == 0
    assert "max_epochs: 7" in proc.stdout and "_target_: recipes.digits.DigitsClassifier" in proc.stdout


@pytest.mark.timeout(60)
def test_digits_recipe_reaches_the_accuracy_bar(tmp_path):
    proc = fw("fit", "conf/digits.yaml", f"trainer.default_root_dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    accuracy = float(re.search(r"val/acc=([0-9.]+)", proc.stdout.splitlines()[-1]).group(1))
    assert accuracy >= 0.95
    run_dir = next((tmp_path / "fw_logs").iterdir())
    assert (run_dir / "config.yaml").read_text().count("DigitsClassifier") == 1  # the merged recipe
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    assert list(run_dir.glob("events.out.tfevents.*"))

    # a later command finds the run's best checkpoint in the run folder, and it scores its accuracy
    proc = fw("validate", "conf/digits.yaml", "ckpt_path=best", f"trainer.default_root_dir={tmp_path}", "logger=false")
    assert proc.returncode == 0, proc.stderr
    best = re.search(r"fw: ckpt_path='best': (\S+), the best that (\S+) recorded", proc.stderr)
    assert best and Path(best.group(1)).parent == run_dir / "checkpoints" and best.group(1) != best.group(2), proc.stderr
    assert float(re.search(r"val/acc=([0-9.]+)", proc.stdout).group(1)) >= 0.95


def test_version_and_the_stage_help_naming_ckpt_path(capsys):
    from framework.cli import main

    with pytest.raises(SystemExit) as end:
        main(["--version"])
    assert end.value.code == 0 and re.fullmatch(r"fw \S+ \(torch \S+, python \S+\)\n", capsys.readouterr().out)
    for stage in ("fit", "validate", "test", "predict"):
        with pytest.raises(SystemExit):
            main([stage, "--help"])
        assert f"example: fw {stage} conf/digits.yaml" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["test", "--help"])
    assert "ckpt_path=best (the best checkpoint of the run's ModelCheckpoint" in capsys.readouterr().out


@pytest.mark.timeout(60)
def test_regression_recipe_runs_without_datasets(tmp_path):
    proc = fw("fit", "conf/regression.yaml", f"trainer.default_root_dir={tmp_path}", "trainer.max_epochs=2")
    assert proc.returncode == 0, proc.stderr
    assert list(tmp_path.glob("fw_logs/version_0/metrics.csv"))


@pytest.mark.timeout(60)
def test_fw_env_reports_the_essentials():
    proc = fw("env")
    assert proc.returncode == 0, proc.stderr
    for word in ("torch", "gloo", "nccl", "mpi"):
        assert word in proc.stdout.lower()


def test_the_local_rank_argument_of_torch_distributed_launch_is_accepted():
    from framework.cli import build_parser

    args = build_parser().parse_args(["--local-rank=1", "fit", "conf/digits.yaml", "trainer.max_epochs=1"])
    assert args.local_rank == 1 and args.command == "fit" and args.overrides == ["trainer.max_epochs=1"]


@pytest.mark.timeout(60)
def test_targets_in_the_working_directory_import(tmp_path):
    (tmp_path / "mymodels.py").write_text("from toy import LinearModel as Net\nfrom toy import ToyData as Data\n")
    (tmp_path / "r.yaml").write_text("module:\n  _target_: mymodels.Net\ndata:\n  _target_: mymodels.Data\n"
                                     "trainer:\n  max_epochs: 1\n  accelerator: cpu\nlogger: false\n")
    env = subprocess_env()
    proc = subprocess.run([str(Path(sys.executable).parent / "fw"), "fit", "r.yaml",
                           "trainer.enable_checkpointing=false"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "fw: final metrics" in proc.stdout


def test_the_final_metrics_show_a_small_value_in_significant_digits(tmp_path, capsys):
    """A learning rate of 2e-05 (LearningRateMonitor's lr-SGD) was shown as 0.0000."""
    from framework.cli import main

    assert main(["fit", str(ROOT / "conf" / "regression.yaml"), "module.lr=0.00002", "trainer.max_epochs=1", "trainer.devices=1",
                 f"trainer.default_root_dir={tmp_path}", "trainer.enable_progress_bar=false",
                 "trainer.enable_model_summary=false",
                 "+callbacks={_target_: framework.callbacks.LearningRateMonitor}"]) == 0
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("fw: final metrics: ")]
    shown = dict(item.split("=") for item in line.removeprefix("fw: final metrics: ").split(", "))
    lr = [value for name, value in shown.items() if name.startswith("lr-")]
    assert lr == ["2e-05"], line
    assert all(len(value.split(".")[-1]) == 4 for name, value in shown.items() if not name.startswith("lr-")), line
