"""Notebooks and spawned workers: in a real Jupyter kernel ``devices=2`` trains on 2 forked
processes (``ddp_notebook``, said in one line), an explicit ``ddp_gloo`` there is one error
naming ``ddp_notebook``, and one Trainer keeps one log version across fit, validate and test;
``ddp_spawn`` from a script without a main guard, or with a module that does not pickle, is one
error naming the fix; a rank that raises reaches the caller with its own traceback, every time."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, subprocess_env

needs_jupyter = pytest.mark.skipif(not all(importlib.util.find_spec(m) for m in ("nbclient", "nbformat", "ipykernel")),
                                   reason="needs nbclient, nbformat and ipykernel (the dev extra)")

CELLS = [
    f"import sys; sys.path.insert(0, {str(ROOT / 'tests')!r})",
    """\
import torch, torch.nn.functional as F
import framework as fw
from framework.loggers import CSVLogger
from toy import loader, regression_data

class Net(fw.TrainModule):  # defined in the notebook: nothing a spawned worker could import
    def __init__(self):
        super().__init__()
        self.save_hyperparameters()  # none: the loggers write an empty hparams.yaml
        torch.manual_seed(0)
        self.net = torch.nn.Linear(4, 1)
    def training_step(self, batch, batch_idx):
        loss = F.mse_loss(self.net(batch[0]), batch[1])
        self.log("train/loss", loss)
        return loss
    def validation_step(self, batch, batch_idx):
        self.log("val/loss", F.mse_loss(self.net(batch[0]), batch[1]))
    def test_step(self, batch, batch_idx):
        self.log("test/loss", F.mse_loss(self.net(batch[0]), batch[1]))
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)
""",
    """\
import logging, io
lines = io.StringIO()
logging.getLogger("framework").addHandler(logging.StreamHandler(lines))
model = Net()
trainer = fw.Trainer(accelerator="cpu", devices=2, max_epochs=2, logger=CSVLogger(ROOT_DIR), enable_progress_bar=False,
                     enable_checkpointing=False, enable_model_summary=False)
trainer.fit(model, loader(regression_data(32), 4), loader(regression_data(16, seed=1), 4))
trainer.validate(model, loader(regression_data(16, seed=1), 4), verbose=False)
trainer.test(model, loader(regression_data(16, seed=2), 4), verbose=False)
try:
    fw.Trainer(accelerator="cpu", devices=2, strategy="ddp_gloo", logger=False).fit(Net(), loader(regression_data(32), 4))
    refused = None
except fw.errors.ConfigError as err:
    refused = str(err)
import json, os
print(json.dumps({"strategy": trainer.strategy.name, "step": trainer.global_step, "world": trainer.world_size,
                  "weight": model.net.weight.flatten().tolist(), "lines": lines.getvalue(), "refused": refused,
                  "versions": sorted(os.listdir(os.path.join(ROOT_DIR, "fw_logs"))),
                  "hparams": sorted(f for f in os.listdir(os.path.join(ROOT_DIR, "fw_logs", "version_0"))
                                    if f.startswith("hparams"))}))
""",
]


@needs_jupyter
@pytest.mark.procs  # the kernel (nbclient starts it)
@pytest.mark.timeout(180)
def test_a_jupyter_kernel_trains_on_two_forked_processes_with_one_log_version(tmp_path):
    import nbformat
    from nbclient import NotebookClient

    cells = [nbformat.v4.new_code_cell(f"ROOT_DIR = {str(tmp_path)!r}"), *map(nbformat.v4.new_code_cell, CELLS)]
    notebook = nbformat.v4.new_notebook(cells=cells)
    client = NotebookClient(notebook, timeout=150, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    client.execute(env=subprocess_env())  # a real kernel (ipykernel_launcher -f kernel.json), this venv's python
    output = notebook.cells[-1].outputs
    text = "".join(o.get("text", "") for o in output if o.get("output_type") == "stream" and o.get("name") == "stdout")
    got = json.loads(text.strip().splitlines()[-1])
    assert got["strategy"] == "ddp_notebook" and got["world"] == 2 and got["step"] == 8
    assert "fw: strategy=auto with devices=2 in a Jupyter kernel: using ddp_notebook" in got["lines"], got["lines"]
    assert got["refused"].startswith("fw's launcher (strategy ddp/ddp_gloo/fsdp with devices > 1) re-runs the "
                                     "program in each worker, and a Jupyter kernel has no program to re-run: use "
                                     "strategy='ddp_notebook'"), got["refused"]
    assert got["versions"] == ["version_0"]  # fit, validate and test of one Trainer: one version
    assert got["hparams"] == ["hparams.yaml"]  # which each call's workers update (not hparams-1.yaml, hparams-2.yaml)


def run(code: str, tmp_path, *argv: str, script: bool = False) -> subprocess.CompletedProcess:
    if script:
        (tmp_path / "job.py").write_text(code)
        cmd = [sys.executable, str(tmp_path / "job.py"), *argv]
    else:
        cmd = [sys.executable, "-c", code, *argv]
    return subprocess.run(cmd, env=subprocess_env(), capture_output=True, text=True, timeout=120, cwd=tmp_path)


HEAD = """
import torch, torch.nn.functional as F
import framework as fw
from toy import LinearModel, loader, regression_data
QUIET = dict(accelerator="cpu", devices=2, max_epochs=1, logger=False, enable_progress_bar=False,
             enable_checkpointing=False, enable_model_summary=False)
"""


@pytest.mark.timeout(60)
def test_spawn_without_a_main_guard_is_one_error_naming_the_guard(tmp_path):
    proc = run(HEAD + "fw.Trainer(strategy='ddp_spawn', **QUIET).fit(LinearModel(), loader(regression_data(16)))\n",
               tmp_path, script=True)
    assert proc.returncode == 1
    assert "bootstrapping" not in proc.stderr and "ProcessExitedException" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last == (f"framework.errors.ConfigError: trainer.strategy=ddp_spawn starts fresh interpreters that each "
                    f"import {tmp_path / 'job.py'}, which would run this fit again (line 7 is not under a main "
                    "guard): put the code that trains under `if __name__ == \"__main__\":`, or use "
                    "strategy='ddp_notebook' (forked workers import nothing)"), proc.stderr


@pytest.mark.timeout(60)
def test_a_module_that_does_not_pickle_is_named_with_its_attribute(tmp_path):
    code = HEAD + """
class Holds(LinearModel):
    def __init__(self):
        super().__init__()
        self.scale = lambda x: 2 * x

if __name__ == "__main__":
    fw.Trainer(strategy='ddp_spawn', **QUIET).fit(Holds(), loader(regression_data(16)))
"""
    proc = run(code, tmp_path, script=True)
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("framework.errors.ConfigError: trainer.strategy=ddp_spawn pickles the Trainer, the model "
                           "and the data for its workers, and Holds.scale cannot be pickled (")
    assert last.endswith("or use strategy='ddp_notebook' (forked workers need no pickling)"), last


FAILS = HEAD + """
import sys, traceback

class FailsOnRankOne(LinearModel):
    def training_step(self, batch, batch_idx):
        if self.global_rank == 1 and batch_idx == 1:
            raise ValueError("rank one's own failure")
        return super().training_step(batch, batch_idx)

def main():
    seen = []
    for _ in range(int(sys.argv[1])):
        try:
            fw.Trainer(strategy=sys.argv[2], **QUIET).fit(FailsOnRankOne(), loader(regression_data(32), 4))
        except ValueError as err:
            notes = "".join(getattr(err, "__notes__", []))
            seen.append(str(err) == "rank one's own failure" and "rank 1 of the" in notes
                        and "in training_step" in notes)
    print(sum(seen))

if __name__ == "__main__":
    main()
"""


REPEATS = int(os.environ.get("FW_SPAWN_FAILURE_REPEATS", "2"))  # the count: 4


@pytest.mark.timeout(60 + 15 * REPEATS)
@pytest.mark.parametrize("strategy", ["ddp_notebook", "ddp_spawn"])
def test_a_rank_that_raises_reaches_the_caller_with_its_traceback_every_time(tmp_path, strategy):
    repeats = REPEATS if strategy == "ddp_notebook" else max(1, REPEATS // 2)  # spawn: fresh interpreters, slower
    proc = run(FAILS, tmp_path, str(repeats), strategy, script=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(repeats), proc.stderr  # the ValueError itself, with rank 1's traceback


@pytest.mark.timeout(60)
def test_python_c_picks_ddp_notebook_for_auto_and_refuses_ddp_gloo(tmp_path):
    code = HEAD + """
import sys
trainer = fw.Trainer(**QUIET)
print(trainer.strategy.name)
try:
    fw.Trainer(strategy="ddp_gloo", **QUIET).fit(LinearModel(), loader(regression_data(16)))
except fw.errors.ConfigError as err:
    print(err)
"""
    proc = run(code, tmp_path)
    assert proc.returncode == 0, proc.stderr
    name, refused = proc.stdout.strip().splitlines()
    assert name == "ddp_notebook"
    assert "fw: strategy=auto with devices=2 in python -c: using ddp_notebook (workers forked from this process)" \
        in proc.stderr
    assert "python -c has no program to re-run: use strategy='ddp_notebook'" in refused
