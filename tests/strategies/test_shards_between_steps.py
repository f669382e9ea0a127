"""Between steps a sharded model holds only shards, also after evaluation: FSDP's root (and
under ``SHARD_GRAD_OP`` every unit) keeps what its forward gathered for the backward, and a
validation step has no backward. A checkpoint saved after validation (``ModelCheckpoint`` with a
monitor) once failed there with ``KeyError: 0`` from ``get_optimizer_state_dict`` under
``SHARD_GRAD_OP`` and under ``model_parallel`` with a model that shards itself; here each saves,
holds the run's final weights, and the parameters at the fit's end are shards (DTensors).
A world of one has the layout of more ranks (tests/distributed/test_fsdp.py runs those)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
import sharded
from forked import in_a_copy

import framework as fw
from framework.callbacks import ModelCheckpoint
from framework.checkpointing.file import load_checkpoint

FSDP = {"name": "fsdp", "auto_wrap_policy": ["Block"]}


class SelfSharded(sharded.Blocks):
    """The same network, sharded by its own ``configure_model`` on the data-parallel mesh, as a
    module written for Lightning's ModelParallelStrategy does: the root is ``self.model``."""

    def __init__(self) -> None:
        super().__init__()
        self.model = nn.Sequential(self.inp, self.blocks, self.head)
        del self.inp, self.blocks, self.head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x).squeeze(-1)

    def configure_model(self) -> None:
        from torch.distributed.fsdp import fully_shard

        mesh = self.device_mesh["data_parallel"]
        for block in self.model[1]:
            fully_shard(block, mesh=mesh)
        fully_shard(self.model, mesh=mesh)


@pytest.mark.parametrize("strategy", [
    FSDP,
    {"name": "fsdp", "auto_wrap_policy": ["Block"], "sharding_strategy": "SHARD_GRAD_OP"},
    "model_parallel",
], ids=["full_shard", "shard_grad_op", "model_parallel"])
@in_a_copy
def test_a_checkpoint_after_validation_saves_the_shards_the_run_ends_with(tmp_path, strategy, monkeypatch):
    if strategy == "model_parallel":
        monkeypatch.setattr(sharded, "Blocks", SelfSharded)
    ckpt = ModelCheckpoint(dirpath=str(tmp_path / "ck"), monitor="val_loss", save_top_k=1, save_last=True)
    run = sharded.fit(strategy, devices=1, max_steps=40, callbacks=[ckpt], root=str(tmp_path))  # 2 epochs
    assert run["global_step"] == 40 and run["sharded"] and run["sharded_at_end"]
    saved = load_checkpoint(tmp_path / "ck" / "last.ckpt")
    assert saved["global_step"] == 40 and (tmp_path / "ck" / "last.ckpt" / "COMMITTED").exists()
    assert saved["state_dict"].keys() == run["weights"].keys()
    assert all(torch.equal(saved["state_dict"][k], v) for k, v in run["weights"].items())
    assert Path(ckpt.best_model_path).is_dir()


@in_a_copy
def test_after_fit_test_and_predict_a_saved_checkpoint_resumes_where_the_fit_ended(tmp_path):
    """Under fsdp, as in Lightning: ``trainer.save_checkpoint`` after the fit returned, and after a
    ``test`` and a ``predict`` on the same trainer, writes the fit's checkpoint (optimizer state,
    progress, the mid-epoch data position) with the sharded weights, and a fit resumed from it ends
    where the uninterrupted fit ends, bit for bit. ``validate(ckpt_path=...)`` then reads the
    weights of a folder that also holds optimizer state."""
    def trainer(max_steps: int) -> fw.Trainer:
        return fw.Trainer(**sharded.QUIET, enable_checkpointing=False, strategy=FSDP, devices=1, max_steps=max_steps,
                          default_root_dir=str(tmp_path))

    train = DataLoader(sharded.data(), batch_size=16)
    val = DataLoader(sharded.data(64), batch_size=16)
    model, first = sharded.Blocks(), trainer(30)  # 20 steps an epoch: it ends mid-epoch
    first.fit(model, train, val)
    first.test(model, val, verbose=False)
    first.predict(model, val)
    first.save_checkpoint(tmp_path / "after.ckpt")
    saved = load_checkpoint(tmp_path / "after.ckpt")
    assert saved["global_step"] == 30 and saved["optimizer_states"][0]["state"]
    resumed, straight = sharded.Blocks(), sharded.Blocks()
    trainer(40).fit(resumed, train, val, ckpt_path=str(tmp_path / "after.ckpt"))
    trainer(40).fit(straight, train, val)
    assert all(torch.equal(a.full_tensor(), b.full_tensor()) for a, b in zip(resumed.parameters(), straight.parameters(),
                                                                             strict=True))
    fresh = sharded.Blocks()
    trainer(40).validate(fresh, val, ckpt_path=str(tmp_path / "after.ckpt"), verbose=False)
    weights = {name: p.full_tensor() for name, p in fresh.named_parameters()}
    assert all(torch.equal(weights[k], v) for k, v in saved["state_dict"].items())
