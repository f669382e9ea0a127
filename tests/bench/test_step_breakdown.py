"""StepTimeBreakdown: a real Trainer, real DDP processes, real TensorBoard files.

Its DDP communication hook reduces as DDP's built-in reduction does, so training with the
breakdown gives bitwise the weights of training without it; the parts it reports are times
that add up to the step, and the comm part is zero alone and positive under DDP.
"""

from __future__ import annotations

import json

import pytest
from forked import run_script

import framework as fw
from framework.callbacks import StepTimeBreakdown
from framework.callbacks.step_breakdown import PARTS
from tests.distributed.helpers import write_script
from tests.distributed.workload import FIT_ARGS, Regressor, regression_data

SCRIPT = """
import json, sys, torch
from torch.utils.data import DataLoader
import framework as fw
from framework.callbacks import StepTimeBreakdown
from workload import FIT_ARGS, Regressor, regression_data

out, with_breakdown = sys.argv[1], sys.argv[2] == "1"
torch.manual_seed(0)
module = Regressor()
callbacks = [StepTimeBreakdown(log=False)] if with_breakdown else []
trainer = fw.Trainer(devices=3, strategy="ddp_gloo", max_epochs=2, callbacks=callbacks, **FIT_ARGS)
trainer.fit(module, train_dataloaders=DataLoader(regression_data(48), batch_size=4))
if trainer.is_global_zero:
    state = {k: v.tolist() for k, v in module.state_dict().items()}
    summary = callbacks[0].summary() if callbacks else None
    hooked = bool(callbacks and callbacks[0].timer is not None)
    json.dump({"state": state, "summary": summary, "hooked": hooked}, open(out, "w"))
"""


@pytest.mark.timeout(60)
def test_ddp_weights_are_bitwise_the_same_with_the_breakdown_and_comm_is_measured(tmp_path):
    script = write_script(tmp_path, SCRIPT)
    results = {}
    for flag in ("0", "1"):
        out = tmp_path / f"result{flag}.json"
        # 3 ranks (forked from this process, as torchrun's workers): a world that does not divide
        # evenly (DDP scales by 1/n, which x / n is not, bit for bit)
        result = run_script(script, str(out), flag, nprocs=3, timeout=45)
        assert result.returncode == 0, result.output
        results[flag] = json.loads(out.read_text())
    assert results["1"]["hooked"]
    assert results["0"]["state"] == results["1"]["state"]  # bitwise: lists of floats compare exactly
    summary = results["1"]["summary"]
    assert summary["steps"] == 8  # 48 samples / (4 per rank * 3 ranks) * 2 epochs
    assert summary["comm_unhidden"] > 0 and summary["comm_span"] >= summary["comm_unhidden"] * 0.5
    assert all(summary[p] >= 0 for p in PARTS)


def test_one_process_parts_add_up_and_go_to_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.data import DataLoader

    breakdown = StepTimeBreakdown()
    from framework.loggers import TensorBoardLogger

    logger = TensorBoardLogger(tmp_path, name="run")
    args = {**FIT_ARGS, "logger": logger}
    trainer = fw.Trainer(max_epochs=3, log_every_n_steps=2, callbacks=[breakdown], **args)
    trainer.fit(Regressor(), train_dataloaders=DataLoader(regression_data(32), batch_size=4))
    assert breakdown.timer is None  # one process: no DDP model to hook
    assert len(breakdown.steps) == 24
    for step in breakdown.steps:
        assert step["comm_unhidden"] == 0.0
        assert sum(step[p] for p in PARTS) == pytest.approx(step["total"], rel=1e-6, abs=1e-9)
        assert step["forward_backward"] > 0 and step["optimizer"] > 0
    events = EventAccumulator(str(logger.log_dir))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {f"step_time/{p}" for p in PARTS} | {"step_time/total_ms"} <= tags
    shares = [events.Scalars(f"step_time/{p}")[-1].value for p in PARTS]
    assert sum(shares) == pytest.approx(1.0, abs=1e-4)
    assert len(events.Scalars("step_time/total_ms")) == 12  # every 2 of 24 steps
