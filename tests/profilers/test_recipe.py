"""``trainer.profiler`` in a recipe: a name as an override (``trainer.profiler=simple``) or a
``_target_`` mapping, through the recipe schema to a real fit with its report."""

from __future__ import annotations

from framework.cli.run_recipe import run_recipe
from framework.config import load_recipe

RECIPE = """\
module:
  _target_: toy.LinearModel
data:
  _target_: toy.ToyData
  n: 32
logger: false
trainer:
  max_epochs: 1
  accelerator: cpu
  devices: 1
  enable_progress_bar: false
  enable_checkpointing: false
"""


def test_a_profiler_named_in_an_override_profiles_the_fit(tmp_path, capsys):
    path = tmp_path / "r.yaml"
    path.write_text(RECIPE)
    recipe, text = load_recipe(path, ["trainer.profiler=simple", f"trainer.default_root_dir={tmp_path}"])
    assert recipe["trainer"]["profiler"] == "simple"
    run_recipe("fit", recipe, text)
    err = capsys.readouterr().err
    assert "FIT Profiler Report" in err
    assert "[Callback]SaveRecipe.on_fit_start" in err and "[LightningModule]LinearModel.configure_optimizers" in err


def test_a_profiler_given_as_a_target_writes_its_file(tmp_path, capsys):
    path = tmp_path / "r.yaml"
    path.write_text(RECIPE)
    recipe, text = load_recipe(path, ["trainer.profiler={_target_: framework.profilers.SimpleProfiler, filename: perf}",
                                      f"trainer.default_root_dir={tmp_path}"])
    run_recipe("fit", recipe, text)
    assert "Profiler Report" not in capsys.readouterr().err
    report = (tmp_path / "fit-perf.txt").read_text()  # no logger: the run folder is default_root_dir
    assert "[_TrainingEpochLoop].train_dataloader_next" in report
