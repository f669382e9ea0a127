"""``PyTorchProfiler``: ``torch.profiler`` around the run writes a Chrome trace into the run folder,
named as Lightning names it, holding the same ``record_function`` ranges Lightning's holds for the
same module (the default schedule's window of training steps, the submodules' forwards); the
operator table goes to stderr."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

import framework as fw
from framework.errors import ConfigError
from framework.profilers import PyTorchProfiler
from tests.profilers.models import loaders, model_class

QUIET = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
             accelerator="cpu", devices=1)
STEP = "[pl][profile][Strategy]SingleDeviceStrategy.training_step"
#: ranges both frameworks record around the same code (Lightning adds its default hooks' own)
SHARED = (STEP, "[pl][profile][_TrainingEpochLoop].train_dataloader_next", "[pl][profile]run_training_batch",
          "[pl][profile][LightningModule]Model.optimizer_step", "[pl][profile][Strategy]SingleDeviceStrategy.backward",
          "[pl][profile][LightningModule]Model.on_train_batch_start", "[pl][module]torch.nn.modules.linear.Linear: layer")


def traces(folder: Path) -> dict[str, Counter]:
    """Each Chrome trace in ``folder`` (by name, less its timestamp): how often each range occurs."""
    found = {}
    for path in folder.glob("*.pt.trace.json"):
        events = json.loads(path.read_text())["traceEvents"]
        found[re.sub(r"\.\d+\.pt\.trace\.json$", "", path.name)] = Counter(e.get("name") for e in events)
    return found


@pytest.mark.parametrize(("train_batches", "val_samples", "trace", "steps"), [
    (7, 0, "training_step", 3),  # the default schedule's window: wait 1, warm up 1, record 3
    (3, 16, "validation_step", 3),  # fewer than 5 steps of each kind: everything, written at the end
])
def test_the_chrome_trace_holds_what_lightnings_holds(tmp_path, capsys, recwarn, train_batches, val_samples, trace,
                                                     steps):
    pl = pytest.importorskip("pytorch_lightning")
    data = loaders(train=8 * train_batches, val=val_samples)[:2 if val_samples else 1]
    fw.Trainer(profiler="pytorch", max_epochs=1, default_root_dir=str(tmp_path / "fw"), **QUIET).fit(
        model_class(fw.TrainModule)(), *data)
    err = capsys.readouterr().err
    warned = any("every step is recorded instead" in str(w.message) for w in recwarn)
    assert warned is (train_batches < 5)  # Lightning warns there too
    assert "FIT Profiler Report" in err and "Profile stats for: records" in err and "aten::" in err  # its operator table
    pl.Trainer(profiler="pytorch", max_epochs=1, default_root_dir=str(tmp_path / "pl"), **QUIET).fit(
        model_class(pl.LightningModule)(), *data)
    ours, theirs = traces(tmp_path / "fw"), traces(tmp_path / "pl")
    assert list(ours) == list(theirs) == [f"fit-[Strategy]SingleDeviceStrategy.{trace}"]
    (ours,), (theirs,) = ours.values(), theirs.values()
    assert ours[STEP] == steps
    assert {name: ours[name] for name in SHARED} == {name: theirs[name] for name in SHARED}


def test_the_trace_goes_to_dirpath_with_the_filename(tmp_path):
    profiler = PyTorchProfiler(dirpath=tmp_path / "traces", filename="perf", record_module_names=False)
    trainer = fw.Trainer(profiler=profiler, max_epochs=1, limit_val_batches=0, **QUIET)
    trainer.fit(model_class(fw.TrainModule)(), loaders(train=48)[0])
    (trace,) = (tmp_path / "traces").glob("*.pt.trace.json")
    assert trace.name.startswith("fit-perf-[Strategy]SingleDeviceStrategy.training_step.")
    names = Counter(e.get("name") for e in json.loads(trace.read_text())["traceEvents"])
    assert names[STEP] == 3 and not any(str(n).startswith("[pl][module]") for n in names)
    report = (tmp_path / "traces" / "fit-perf.txt").read_text()
    assert report.startswith("FIT Profiler Report") and "aten::" in report


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"sort_by_key": "speed"}, r"sort_by_key='speed'\): use one of count, cpu_memory_usage"),
    ({"schedule": 3}, r"schedule=3\): give a callable"),
    ({"table_kwargs": {"row_limit": 3}}, "give row_limit as the profiler's own argument"),
    ({"table_kwargs": {"colour": 1}}, "EventList.table takes"),
])
def test_wrong_arguments_are_refused(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        PyTorchProfiler(**kwargs)
