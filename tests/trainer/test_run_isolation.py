"""A run leaves nothing behind: two Trainers in one process, one after the other (fit, then
test, then another fit with other settings), behave as if each ran alone, in one process and
on 2 Gloo ranks; the process-wide settings a run touches are put back after it."""

from __future__ import annotations

import json
import logging
import os
import sys

import pytest
import torch
from distributed.helpers import check_ok, write_script
from forked import run_script
from toy import QUIET, DropoutMLP, LinearModel, loader, regression_data

import framework as fw


def process_settings() -> dict:
    """What a run could change for everything that runs after it in this process."""
    return {
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "excepthook": sys.excepthook,
        "environ": dict(os.environ),
        "elastic_log_level": logging.getLogger("torch.distributed.elastic").level,
    }


def second_run(root) -> dict:
    """The run under test: seeded, shuffled, dropout, accumulation 2, not deterministic."""
    fw.seed_everything(7)
    model = DropoutMLP()
    trainer = fw.Trainer(**QUIET, max_epochs=2, accumulate_grad_batches=2, default_root_dir=str(root))
    trainer.fit(model, loader(regression_data(48), 8, shuffle=True))
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_two_trainers_in_one_process_behave_as_if_each_ran_alone(tmp_path):
    alone = second_run(tmp_path / "alone")
    before = process_settings()

    fw.seed_everything(1)
    first = fw.Trainer(**QUIET, max_epochs=3, deterministic=True, default_root_dir=str(tmp_path / "first"))
    first.fit(LinearModel(), loader(regression_data(32), 8, shuffle=True), loader(regression_data(16), 8))
    assert process_settings() == before  # deterministic mode was on for the run only
    first.test(LinearModel(), loader(regression_data(16), 8))
    assert process_settings() == before

    after = second_run(tmp_path / "second")
    assert process_settings() == before
    for key in alone:
        assert torch.equal(alone[key], after[key]), key


def test_deterministic_is_on_during_the_run_only(tmp_path):
    seen = []

    class Probe(LinearModel):
        def on_train_start(self):
            seen.append(torch.are_deterministic_algorithms_enabled())

    fw.Trainer(**QUIET, max_epochs=1, deterministic=True).fit(Probe(), loader(regression_data(8), 8))
    assert seen == [True] and not torch.are_deterministic_algorithms_enabled()


SCRIPT = """
import json, logging, os, sys
import torch
from torch.utils.data import DataLoader
import framework as fw
import workload

out, which = sys.argv[1], sys.argv[2]

def settings():
    # torch sets TORCHINDUCTOR_CACHE_DIR once, when DDP first imports its compiler parts
    environ = sorted((k, v) for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR")
    return [torch.are_deterministic_algorithms_enabled(), repr(sys.excepthook), environ,
            logging.getLogger("torch.distributed.elastic").level]

def second():
    # other settings than the first Trainer: shuffled, accumulation 2, another seed, no determinism
    fw.seed_everything(11)
    model = workload.Regressor()
    trainer = fw.Trainer(devices=2, strategy="ddp_gloo", max_epochs=2, accumulate_grad_batches=2,
                         **workload.FIT_ARGS)
    trainer.fit(model, DataLoader(workload.regression_data(64), batch_size=4, shuffle=True))
    return trainer.global_rank, torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()

if which == "both":
    fw.seed_everything(3)
    before = settings()
    first = fw.Trainer(devices=2, strategy="ddp_gloo", max_epochs=3, deterministic=True, **workload.FIT_ARGS)
    first.fit(workload.Regressor(), DataLoader(workload.regression_data(32), batch_size=2, shuffle=True))
    assert settings() == before, "fit changed process-wide settings"
    first.test(workload.Regressor(), DataLoader(workload.regression_data(16), batch_size=4))
    assert settings() == before, "test changed process-wide settings"
rank, params = second()
with open(f"{out}/{which}_rank{rank}.json", "w") as f:
    json.dump(params, f)
"""


@pytest.mark.timeout(60)
def test_two_trainers_under_ddp_behave_as_if_each_ran_alone(tmp_path):
    script = write_script(tmp_path, SCRIPT)
    check_ok(run_script(script, str(tmp_path), "alone", nprocs=2, timeout=30))
    check_ok(run_script(script, str(tmp_path), "both", nprocs=2, timeout=30))
    for rank in (0, 1):
        alone = json.loads((tmp_path / f"alone_rank{rank}.json").read_text())
        both = json.loads((tmp_path / f"both_rank{rank}.json").read_text())
        assert alone == both, f"rank {rank}: the second Trainer trained differently after the first"


def test_a_run_whose_set_up_fails_still_puts_the_process_settings_back(tmp_path):
    class FailsToPrepare(LinearModel):
        def prepare_data(self):
            raise RuntimeError("download failed")

    data = loader(regression_data(8), batch_size=4)
    fw.Trainer(**{**QUIET, "max_epochs": 1}).fit(LinearModel(), data)  # torch's once-per-process set-up
    before = process_settings()
    trainer = fw.Trainer(**{**QUIET, "deterministic": True, "default_root_dir": str(tmp_path)})
    with pytest.raises(RuntimeError, match="download failed"):
        trainer.fit(FailsToPrepare(), data)
    assert process_settings() == before
