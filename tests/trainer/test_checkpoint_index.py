"""The index beside the checkpoints (``framework/checkpointing/index.py``): a restarted job finds its
run's newest checkpoint from it without reading the checkpoints, drops what top-k pruning
removed, and reads a file the index does not vouch for (written over by something else)."""

from __future__ import annotations

import json

import pytest
import torch
from toy import QUIET, LinearModel, loader, regression_data

import framework as fw
from framework.callbacks import ModelCheckpoint
from framework.checkpointing import search


def fit_with_checkpoints(folder, **saver) -> None:
    """A fit of its own (each fit of a program has its own ``fit_index``, which the search matches)."""
    callbacks = [ModelCheckpoint(dirpath=folder, every_n_train_steps=1, **{"filename": "{step}", **saver})]
    fw.Trainer(**{**QUIET, "enable_checkpointing": True}, max_epochs=1, callbacks=callbacks).fit(
        LinearModel(), loader(regression_data(32), 8))


def test_a_run_finds_its_newest_checkpoint_without_reading_any(tmp_path, monkeypatch):
    fit_with_checkpoints(tmp_path / "a", save_top_k=2, monitor="step", mode="max")
    fit_with_checkpoints(tmp_path / "a", save_top_k=-1, filename="b-{step}")  # another fit, same folder, later
    index = json.loads((tmp_path / "a" / ".fw-checkpoints.json").read_text())
    on_disk = sorted(p.name for p in (tmp_path / "a").glob("*.ckpt"))
    assert sorted(index) == on_disk and len(on_disk) == 6  # what top-k removed is gone from it
    first = index["step=4.ckpt"]["fit_index"]
    assert {entry["fit_index"] for entry in index.values()} == {first, first + 1}

    read = []
    real = search.read_values  # where the search looks it up
    monkeypatch.setattr(search, "read_values", lambda path: read.append(path) or real(path))
    match = {"run_id": None, "fit_index": first}
    found = search.newest_checkpoint_of_run([str(tmp_path)], match)
    assert found == str(tmp_path / "a" / "step=4.ckpt")  # the first fit's newest
    assert read == []  # the index answered for every file

    # a file written over by something else is read, not taken on the index's word
    changed = torch.load(found, weights_only=True)
    changed["fit_index"] = 999
    torch.save(changed, found)
    assert search.newest_checkpoint_of_run([str(tmp_path)], match) == str(tmp_path / "a" / "step=3.ckpt")
    assert read == [found]


@pytest.mark.parametrize("damage", ["missing", "garbage"])
def test_without_a_usable_index_the_files_are_read(tmp_path, damage):
    fit_with_checkpoints(tmp_path, save_top_k=-1)
    index = tmp_path / ".fw-checkpoints.json"
    fit_index = next(iter(json.loads(index.read_text()).values()))["fit_index"]
    if damage == "missing":
        index.unlink()
    else:
        index.write_text("{not json")
    found = search.newest_checkpoint_of_run([str(tmp_path)], {"run_id": None, "fit_index": fit_index})
    assert found is not None and torch.load(found, weights_only=True)["global_step"] == 4
