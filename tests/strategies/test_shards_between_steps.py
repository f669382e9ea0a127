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

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
import sharded  # noqa: E402
from forked import in_a_copy  # noqa: E402

import framework as fw  # noqa: E402
from framework.callbacks import ModelCheckpoint  # noqa: E402
from framework.checkpoint import load_checkpoint  # noqa: E402


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


class Shards(fw.Callback):
    """Whether every parameter is a shard at the fit's end (after the last validation)."""

    at_end = False

    def on_fit_end(self, trainer, pl_module) -> None:
        self.at_end = all(hasattr(p, "to_local") for p in pl_module.parameters())


@pytest.mark.parametrize("strategy", [
    {"name": "fsdp", "auto_wrap_policy": ["Block"]},
    {"name": "fsdp", "auto_wrap_policy": ["Block"], "sharding_strategy": "SHARD_GRAD_OP"},
    "model_parallel",
], ids=["full_shard", "shard_grad_op", "model_parallel"])
@in_a_copy
def test_a_checkpoint_after_validation_saves_the_shards_the_run_ends_with(tmp_path, strategy, monkeypatch):
    if strategy == "model_parallel":
        monkeypatch.setattr(sharded, "Blocks", SelfSharded)
    ckpt = ModelCheckpoint(dirpath=str(tmp_path / "ck"), monitor="val_loss", save_top_k=1, save_last=True)
    shards = Shards()
    run = sharded.fit(strategy, devices=1, max_steps=40, callbacks=[ckpt, shards], root=str(tmp_path))  # 2 epochs
    assert run["global_step"] == 40 and run["sharded"] and shards.at_end
    saved = load_checkpoint(tmp_path / "ck" / "last.ckpt")
    assert saved["global_step"] == 40 and (tmp_path / "ck" / "last.ckpt" / "COMMITTED").exists()
    assert saved["state_dict"].keys() == run["weights"].keys()
    assert all(torch.equal(saved["state_dict"][k], v) for k, v in run["weights"].items())
    assert Path(ckpt.best_model_path).is_dir()
