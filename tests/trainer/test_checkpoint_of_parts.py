"""Checkpoints saved as stateful parts by main before issue 49 moved the code into packages
(``tests/fixtures/parts_checkpoint.py``: a mid-epoch file with the callbacks' states, and an FSDP
DCP folder) are read and resumed by today's code: nothing they pickled names a moved module, and
what they hold is restored.

As in test_checkpoint_format.py, what holds on any processor is checked everywhere (the state a
file restores, the samples the resumed run reads, that it continues exactly as a checkpoint of
today's of that same state does); the end against the fixture's own uninterrupted run is
compared bit for bit where this machine's run today reproduces that run."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from fixtures.parts_checkpoint import CHECKPOINT, FINAL, FSDP, SHARDED, SHARDED_WEIGHTS, fit
from fixtures.resume_checks import Record
from fixtures.resume_checks import equal as _equal
from fixtures.resume_checks import weights as _weights

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
import sharded
from forked import call


def _same(a, b) -> bool:
    """Equal all the way down: tensors and arrays element for element, bit for bit."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and np.array_equal(a, b)
    return type(a) is type(b) and a == b


def test_a_parts_checkpoint_restores_its_state_callbacks_included_and_reads_the_rest_of_the_epoch(tmp_path):
    old = torch.load(CHECKPOINT, weights_only=False)
    seen, read = Record(), Record(save_to=str(tmp_path / "now.ckpt"))
    straight = fit(root=str(tmp_path / "straight"), extra_callbacks=[seen])
    resumed = fit(ckpt_path=CHECKPOINT, root=str(tmp_path / "resumed"), extra_callbacks=[read])
    assert resumed.global_step == straight.global_step == 16
    assert len(read.batches) == 4 and all(torch.equal(a, b) for a, b in zip(read.batches, seen.batches[12:], strict=True))
    new = torch.load(tmp_path / "now.ckpt", weights_only=False)
    assert (new["epoch"], new["global_step"]) == (old["epoch"], old["global_step"]) == (1, 12)
    assert _equal(new["state_dict"], old["state_dict"])
    for key in ("optimizer_states", "lr_schedulers", "loop", "rng", "metrics", "loader_states"):
        assert _same(new[key], old[key]), key
    assert old["callbacks"].keys() < new["callbacks"].keys()  # and Record's
    for name, state in old["callbacks"].items():
        # Saved into another folder, a ModelCheckpoint keeps only best_model_path of its top-k (Lightning's rule)
        elsewhere = {"dirpath", "best_k_models", "best_model_score", "current_score", "kth_best_model_path",
                     "kth_value"} if name.startswith("ModelCheckpoint") else set()
        assert _same({k: v for k, v in new["callbacks"][name].items() if k not in elsewhere},
                     {k: v for k, v in state.items() if k not in elsewhere}), name
    assert "best_model_path" in old["callbacks"][next(k for k in old["callbacks"] if k.startswith("ModelCheckpoint"))]
    again = fit(ckpt_path=str(tmp_path / "now.ckpt"), root=str(tmp_path / "again"))
    assert _equal(_weights(again), _weights(resumed))
    assert _equal(dict(again.callback_metrics), dict(resumed.callback_metrics))
    for name, value in _weights(resumed).items():
        torch.testing.assert_close(value, _weights(straight)[name], rtol=0, atol=1e-5)
    final = torch.load(FINAL, weights_only=False)
    if _equal(_weights(straight), final["state_dict"]):  # this machine rounds as the fixture's did
        assert _equal(_weights(resumed), final["state_dict"])
        assert all(torch.equal(resumed.callback_metrics[k], v) for k, v in final["callback_metrics"].items())


def test_a_sharded_folder_of_parts_loads_the_weights_it_was_saved_with():
    model = sharded.Blocks.load_from_checkpoint(SHARDED)
    assert _equal({k: v for k, v in model.state_dict().items()}, torch.load(SHARDED_WEIGHTS))


def _resume_sharded(root: str) -> tuple[dict, dict]:
    straight = sharded.fit(FSDP, devices=1, max_steps=8, root=root)
    resumed = sharded.fit(FSDP, devices=1, max_steps=8, ckpt_path=SHARDED, root=root)
    return straight, resumed


@pytest.mark.procs
def test_fsdp_resumes_a_sharded_folder_of_parts_to_the_end_of_the_run(tmp_path):
    straight, resumed = call(_resume_sharded, str(tmp_path))  # a forked copy: FSDP's groups end with it
    assert resumed["global_step"] == 8
    for name, value in resumed["weights"].items():
        torch.testing.assert_close(value, straight["weights"][name], rtol=0, atol=1e-5)
