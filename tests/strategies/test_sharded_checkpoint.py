"""A sharded (DCP) checkpoint folder outside FSDP: ``load_from_checkpoint`` and ``validate``
in one process accept it, ``fw checkpoint export`` makes one file of it; an incomplete folder,
one of another model and one whose metadata would run code are refused in one line, with
nothing loaded. (FSDP in one process writes the folder: a world of one has the same layout.)"""

from __future__ import annotations

import pickle
import shutil
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
import sharded
from forked import call, in_a_copy

import framework as fw
from framework.callbacks import ModelCheckpoint
from framework.checkpointing.file import load_checkpoint
from framework.cli import main as fw_main
from framework.errors import CheckpointError

FSDP = {"name": "fsdp", "auto_wrap_policy": ["Block"]}


def _write_folder(root: Path) -> None:
    ckpt = ModelCheckpoint(dirpath=str(root / "ck"), every_n_train_steps=4, save_top_k=-1)
    sharded.fit(FSDP, devices=1, max_steps=4, callbacks=[ckpt], root=str(root))


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("sharded")
    call(_write_folder, root)  # in a forked copy: a sharded run's groups live as long as its process
    path = root / "ck" / "epoch=0-step=4.ckpt"
    assert path.is_dir() and (path / "COMMITTED").exists()
    return path

def _copy(folder: Path, tmp_path: Path, name: str = "copy.ckpt") -> Path:
    shutil.copytree(folder, tmp_path / name)
    return tmp_path / name


def test_load_from_checkpoint_and_validate_in_one_process_read_the_folder(folder, tmp_path):
    weights = load_checkpoint(folder)["state_dict"]
    model = sharded.Blocks.load_from_checkpoint(folder)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in weights.items())
    assert not all(torch.equal(sharded.Blocks().state_dict()[k], v) for k, v in weights.items())  # it trained
    trainer = fw.Trainer(**{**sharded.QUIET, "default_root_dir": str(tmp_path)})
    fresh = sharded.Blocks()
    (scores,) = trainer.validate(fresh, DataLoader(sharded.data(32), batch_size=16), ckpt_path=str(folder))
    assert all(torch.equal(fresh.state_dict()[k], v) for k, v in weights.items()) and "val_loss" in scores


def test_export_writes_one_file_plain_torch_loads(folder, tmp_path):
    assert fw_main(["checkpoint", "export", str(folder), str(tmp_path / "w.pt"), "--weights-only"]) == 0
    plain = sharded.Blocks()
    plain.load_state_dict(torch.load(tmp_path / "w.pt", weights_only=True))
    assert all(torch.equal(plain.state_dict()[k], v) for k, v in load_checkpoint(folder)["state_dict"].items())


def test_an_incomplete_folder_is_refused_and_nothing_is_loaded(folder, tmp_path, capsys):
    broken = _copy(folder, tmp_path)
    (broken / "COMMITTED").unlink()
    with pytest.raises(CheckpointError, match=r"is incomplete \(no COMMITTED mark: a save that did not finish"):
        sharded.Blocks.load_from_checkpoint(broken)
    assert fw_main(["checkpoint", "export", str(broken), str(tmp_path / "x.pt")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("fw: error: checkpoint") and "incomplete" in err[-1] and not (tmp_path / "x.pt").exists()


def test_metadata_that_would_run_code_is_refused_unread(folder, tmp_path):
    evil = _copy(folder, tmp_path)

    class RunsCode:
        def __reduce__(self):
            return (Path.touch, (tmp_path / "ran",))

    (evil / ".metadata").write_bytes(pickle.dumps(RunsCode()))
    with pytest.raises(CheckpointError, match=r"its \.metadata is missing or holds data that is not DCP's"):
        load_checkpoint(evil)
    assert not (tmp_path / "ran").exists()


def test_a_folder_of_another_model_is_refused_naming_the_parameters(folder, tmp_path):
    class Wider(sharded.Blocks):
        def __init__(self) -> None:
            super().__init__(width=24)

    with pytest.raises(CheckpointError, match=r"does not fit Wider: .*size mismatch for inp.weight"):
        Wider.load_from_checkpoint(folder)


@in_a_copy
def test_under_fsdp_a_folder_of_another_model_is_refused_before_any_tensor_loads(folder, tmp_path, monkeypatch):
    class Wider(sharded.Blocks):
        def __init__(self) -> None:
            super().__init__(width=24)

    monkeypatch.setattr(sharded, "Blocks", Wider)
    with pytest.raises(CheckpointError, match=r"does not fit this model and its optimizers \(other shapes: "
                                              r"model/blocks.0.linear.bias, model/blocks.0.linear.weight"):
        sharded.fit(FSDP, devices=1, max_steps=8, ckpt_path=str(folder), root=str(tmp_path))

@in_a_copy
def test_model_checkpoint_keeps_top_k_and_last_as_folders(tmp_path):
    """save_top_k=2 with a monitor, and save_last: the two best epochs' folders and last.ckpt
    (overwritten in place at each save) stay, each committed; nothing partial is left."""
    ckpt = ModelCheckpoint(dirpath=str(tmp_path / "ck"), monitor="val_loss", save_top_k=2, save_last=True)
    sharded.fit(FSDP, devices=1, max_steps=80, callbacks=[ckpt], root=str(tmp_path))  # 4 epochs of 20 steps
    names = sorted(p.name for p in (tmp_path / "ck").iterdir())
    assert len(names) == 3 and "last.ckpt" in names, names
    assert all((tmp_path / "ck" / name / "COMMITTED").exists() for name in names)
    assert load_checkpoint(tmp_path / "ck" / "last.ckpt")["global_step"] == 80
    kept = sorted(load_checkpoint(tmp_path / "ck" / name)["global_step"] for name in names if name != "last.ckpt")
    assert Path(ckpt.best_model_path).name in names and len(set(kept)) == 2
