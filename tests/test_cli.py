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


@pytest.mark.parametrize(("args", "code", "pattern"), [
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
    (tmp_path / "conf").symlink_to(ROOT / "conf")  # the recipes as README.md names them; the run writes here
    proc = fw_command(*args, cwd=tmp_path, env=subprocess_env())  # the command's main(), in a fork of this process
    assert proc.returncode == code, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("fw: error:"), proc.stderr
    assert re.search(pattern, lines[-1]), lines[-1]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(("override", "key"), [
    ("trainer.default_root_dir=gs://bucket/run", "trainer.default_root_dir='gs://bucket/run'"),
    ("ckpt_path=gs://bucket/run/last.ckpt", "ckpt_path='gs://bucket/run/last.ckpt'"),
    ("callbacks.0.dirpath=gs://bucket/ck", "ModelCheckpoint dirpath='gs://bucket/ck'"),
    ("logger.save_dir=az://container/logs", "TensorBoardLogger save_dir='az://container/logs'"),
])
@pytest.mark.timeout(30)
def test_a_url_without_its_back_end_is_one_line_before_anything_is_created(override, key, tmp_path):
    """Issue 47, item 11: ``s3://bucket/run`` made a local folder ``s3:`` (and a missing bucket
    ended in botocore's traceback). A URL is written through fsspec now (tests/storage); one whose
    package is not installed (gcsfs, adlfs here) is refused in one line naming the key."""
    proc = fw_command("fit", str(ROOT / "conf" / "digits.yaml"), override, "trainer.enable_progress_bar=false",
                      cwd=tmp_path, env=subprocess_env())
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"fw: error: {key}: reading and writing ") and "needs a package that is missing" in last, \
        proc.stderr
    assert "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.timeout(120)
def test_a_later_command_never_rewrites_a_runs_record(tmp_path):
    """Issue 47, item 2: ``fw test ... ckpt_path=last`` rewrote the fit's config.yaml (with the
    recipe's max_epochs, without the fit's EarlyStopping), and so did one that failed loading the
    checkpoint (with the wrong width); a resumed fit wrote its hparams.yaml over the fit's."""
    common = [str(ROOT / "conf" / "digits.yaml"), "trainer.enable_progress_bar=false", f"trainer.default_root_dir={tmp_path}",
              "trainer.limit_train_batches=2", "trainer.limit_val_batches=2", "trainer.limit_test_batches=2"]
    early_stopping = "+callbacks={_target_: framework.callbacks.EarlyStopping, monitor: val/acc, mode: max}"
    proc = fw("fit", *common, "module.hidden=64", "trainer.max_epochs=2", early_stopping, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    fit = tmp_path / "fw_logs" / "version_0"
    recorded = (fit / "config.yaml").read_text()
    assert "hidden: 64" in recorded and "max_epochs: 2" in recorded and "EarlyStopping" in recorded
    fitted = _files(tmp_path)

    proc = fw("test", *common, "ckpt_path=last", cwd=tmp_path)  # the recipe's hidden: 128
    assert proc.returncode == 1 and "does not fit this model: size mismatch" in proc.stderr, proc.stderr
    assert _files(tmp_path) == fitted  # nothing written: no record of a run that did not run

    proc = fw("test", *common, "ckpt_path=last", "module.hidden=64", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    after = _files(tmp_path)
    assert {k: v for k, v in after.items() if k in fitted} == fitted
    tested = {k for k in after if k not in fitted}
    assert "fw_logs/version_1/test-config.yaml" in tested and all(k.startswith("fw_logs/version_1/") for k in tested)
    assert "ckpt_path: last" in (tmp_path / "fw_logs" / "version_1" / "test-config.yaml").read_text()

    hparams = (fit / "hparams.yaml").read_bytes()
    proc = fw("fit", *common, "module.hidden=64", "trainer.max_epochs=3", "ckpt_path=last", "module.lr=0.001",
              cwd=tmp_path)  # a resume
    assert proc.returncode == 0, proc.stderr
    assert (fit / "config.yaml").read_text() == recorded
    assert (fit / "hparams.yaml").read_bytes() == hparams  # the resume wrote lr: 0.001 over it
    assert "lr: 0.001" in (fit / "hparams-1.yaml").read_text()
    assert f"{fit / 'hparams.yaml'} is an earlier command's record and stays as it is; this run's hyperparameters " \
           "are hparams-1.yaml" in proc.stderr
    assert "max_epochs: 3" in (fit / "config-1.yaml").read_text()
    assert f"{fit / 'config.yaml'} is an earlier command's record and stays as it is; this run's recipe is " \
           "config-1.yaml" in proc.stderr


@pytest.mark.parametrize("make_file", [None, lambda path: path.write_bytes(b"not a checkpoint")],
                         ids=["missing", "damaged"])
@pytest.mark.timeout(60)
def test_a_refused_run_leaves_nothing_behind(make_file, tmp_path):
    """Issue 47, item 3: a fit refused for its checkpoint left a new version_N/ with config.yaml,
    hparams.yaml and an event file."""
    if make_file is not None:
        make_file(tmp_path / "x.ckpt")
    before = _files(tmp_path)
    proc = fw("fit", str(ROOT / "conf" / "digits.yaml"), "ckpt_path=x.ckpt", "trainer.enable_progress_bar=false",
              "trainer.default_root_dir=runs/digits", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert re.search(r"^fw: error: checkpoint 'x.ckpt' (does not exist|is corrupt)", proc.stderr.splitlines()[-1])
    assert _files(tmp_path) == before and not (tmp_path / "runs").exists()


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
