"""``AdvancedProfiler``: ``cProfile`` per action, its statistics written to the report file (and,
with ``dump_stats``, to a ``.prof`` file per action that ``pstats`` reads back), as Lightning's."""

from __future__ import annotations

import pickle
import pstats
import re

import pytest
import torch

import framework as fw
from framework.errors import ConfigError
from framework.profilers import AdvancedProfiler
from tests.profilers.models import loaders, model_class

QUIET = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
             accelerator="cpu", devices=1)
STEP = "[Strategy]SingleDeviceStrategy.training_step"


@pytest.fixture(autouse=True)
def _torch_optim_imported():
    """torch.optim's first optimizer imports torch._dynamo (seconds, many more under cProfile): not here."""
    torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)


def test_the_cprofile_statistics_are_written_per_action(tmp_path):
    profiler = AdvancedProfiler(filename="perf", dump_stats=True)
    trainer = fw.Trainer(profiler=profiler, max_epochs=1, default_root_dir=str(tmp_path), **QUIET)
    trainer.fit(model_class(fw.TrainModule)(), *loaders())
    report = (tmp_path / "fit-perf.txt").read_text()
    assert report.startswith("FIT Profiler Report")
    sections = dict(re.findall(r"Profile stats for: (\S+)\n(.*?)(?=Profile stats for: |\Z)", report, re.DOTALL))
    assert {STEP, "[LightningModule]Model.on_train_batch_start", "run_training_epoch"} <= set(sections)
    # the user's training_step ran 5 times (40 samples, batches of 8), each inside the step's action
    assert re.search(r"^\s+5\s+.*models\.py:\d+\(training_step\)$", sections[STEP], re.MULTILINE), sections[STEP]
    assert "Ordered by: cumulative time" in sections[STEP]
    dumped = tmp_path / f"fit-perf-{STEP}.prof"
    stats = pstats.Stats(str(dumped)).stats  # {(file, line, function): (calls, ...)}
    assert [value[1] for key, value in stats.items() if key[2] == "training_step" and key[0].endswith("models.py")] == [5]


def test_the_report_is_logged_without_a_filename_and_the_profiler_pickles(capsys):
    profiler = AdvancedProfiler(line_count_restriction=3)
    fw.Trainer(profiler=profiler, max_epochs=1, limit_val_batches=0, **QUIET).fit(model_class(fw.TrainModule)(),
                                                                                   loaders()[0])
    err = capsys.readouterr().err
    assert f"Profile stats for: {STEP}" in err and "due to restriction <3>" in err
    assert profiler.profiled_actions == {}  # torn down after its report
    with profiler.profile("x"):
        copy = pickle.loads(pickle.dumps(profiler))  # e.g. for ddp_spawn's workers: without its cProfile objects
    assert copy.profiled_actions == {} and copy.line_count_restriction == 3


def test_dump_stats_without_a_folder_is_refused():
    profiler = AdvancedProfiler(dump_stats=True)
    with profiler.profile("x"):
        pass
    with pytest.raises(ConfigError, match=r"dump_stats=True.*give dirpath"):
        profiler.summary()
