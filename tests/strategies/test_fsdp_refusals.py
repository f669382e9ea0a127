"""What FSDP cannot train with is refused before training, in one line that says what to do
(one process: a world of one shards nothing, but runs every check)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
import sharded
from forked import in_a_copy

from framework.errors import CheckpointError, ConfigError
from framework.strategies import create_strategy

FSDP = {"name": "fsdp", "auto_wrap_policy": ["Block"]}


class BuiltTooEarly(sharded.Blocks):
    def __init__(self) -> None:
        super().__init__()
        self.optimizer = torch.optim.AdamW(self.parameters(), lr=1e-2)

    def configure_optimizers(self):
        return self.optimizer


@in_a_copy
def test_an_optimizer_built_before_sharding_is_refused(monkeypatch):
    monkeypatch.setattr(sharded, "Blocks", BuiltTooEarly)
    with pytest.raises(ConfigError, match=r"optimizer 0 \(AdamW\) holds 8 parameter\(s\) that FSDP did not shard.*"
                                          r"Build it in configure_optimizers\(\)"):
        sharded.fit(FSDP, devices=1, max_steps=1)


@in_a_copy  # the world of one's group is up when the check fails: the error's frames keep it alive
def test_a_wrap_class_the_model_lacks_is_named_with_the_classes_it_has():
    with pytest.raises(ConfigError, match=r"auto_wrap_policy: Blocks has no submodule of class Layer; "
                                          r"its submodules' classes: Block, Linear, Sequential"):
        sharded.fit({**FSDP, "auto_wrap_policy": ["Layer"]}, devices=1, max_steps=1)


@pytest.mark.parametrize(("options", "message"), [
    ({"sharding_strategy": "HYBRID"}, r"sharding_strategy: 'HYBRID' is not one fw runs; use FULL_SHARD or "
                                      r"SHARD_GRAD_OP or HYBRID_SHARD"),
    ({"device_mesh": [2, 2]}, r"device_mesh is for sharding_strategy HYBRID_SHARD, not FULL_SHARD"),
    ({"sharding_strategy": "HYBRID_SHARD", "device_mesh": [2]}, r"device_mesh=\[2\]: give \[replicas, shard size\]"),
    ({"state_dict_type": "local"}, r"state_dict_type: 'local' is not one fw writes; use sharded \(a folder of every "
                                   r"rank's shards\) or full"),
    ({"auto_wrap_policy": [3]}, r"auto_wrap_policy: 3 is not a module class or its name"),
    ({"async_save": True, "state_dict_type": "full"}, r"async_save=true writes sharded checkpoints in the background; "
                                                      r"it needs state_dict_type: sharded"),
    ({"backend": "mpi"}, r"trainer.strategy.backend=mpi with strategy fsdp: not supported .*under mpiexec use "
                         r"backend gloo: the ranks and the rendezvous come from MPI"),
])
def test_options_fsdp_does_not_run_are_refused(options, message):
    with pytest.raises(ConfigError, match=message):
        create_strategy({**FSDP, **options}, "cpu")


@in_a_copy
def test_16_mixed_is_refused_not_run_in_another_precision():
    with pytest.raises(ConfigError, match=r"trainer.precision=16-mixed with strategy fsdp: not supported \(16-mixed "
                                          r"needs a sharded gradient scaler\)"):
        sharded.fit(FSDP, devices=1, max_steps=1, precision="16-mixed")


@in_a_copy
def test_a_hybrid_mesh_that_is_not_the_world_size_is_refused():
    with pytest.raises(ConfigError, match=r"device_mesh=\[2, 2\]: 2 x 2 ranks is not the world size 1"):
        sharded.fit({**FSDP, "sharding_strategy": "HYBRID_SHARD", "device_mesh": [2, 2]}, devices=1, max_steps=1)


@in_a_copy
def test_a_one_process_checkpoint_resumes_under_fsdp_and_one_for_other_parameters_is_refused(tmp_path):
    """Its AdamW state is keyed by position: renamed onto the sharded parameters, it ends where
    one process ends; a state whose groups do not fit is refused, not loaded onto other
    parameters."""
    import torch

    from framework.callbacks import ModelCheckpoint

    ckpt = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1)
    sharded.fit("single", devices=1, max_steps=2, callbacks=[ckpt], root=str(tmp_path))
    straight = sharded.fit("single", devices=1, max_steps=4, root=str(tmp_path))
    saved = torch.load(tmp_path / "epoch=0-step=2.ckpt", weights_only=True)
    params = saved["optimizer_states"][0]["param_groups"][0]["params"]
    saved["optimizer_states"][0]["param_groups"][0]["params"] = params[:-1]
    torch.save(saved, tmp_path / "other.ckpt")
    resumed = sharded.fit(FSDP, devices=1, max_steps=4, ckpt_path=str(tmp_path / "epoch=0-step=2.ckpt"),
                          root=str(tmp_path))
    assert resumed["global_step"] == 4 and resumed["sharded"]
    weights = straight["weights"]
    assert max(float((resumed["weights"][k] - weights[k]).abs().max()) for k in weights) < 1e-5
    with pytest.raises(CheckpointError, match=rf"AdamW state has parameter groups of \[{len(params) - 1}\] "
                                              rf"parameters, and configure_optimizers\(\) made \[{len(params)}\]"):
        sharded.fit(FSDP, devices=1, max_steps=4, ckpt_path=str(tmp_path / "other.ckpt"), root=str(tmp_path))

@in_a_copy
def test_a_sharded_model_serves_the_next_call_and_refuses_another_layout(tmp_path):
    """After fit the module stays sharded and its group up (fit, then predict, as in Lightning);
    a call that would shard it another way is refused. (Each FSDP run in one process runs in a
    forked copy: its groups live as long as its process, see tests/forked.py's ``call``.)"""
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    import framework as fw

    model = sharded.Blocks()
    loader = DataLoader(sharded.data(32), batch_size=16)
    quiet = {**sharded.QUIET, "enable_checkpointing": False, "default_root_dir": str(tmp_path)}
    fw.Trainer(**quiet, strategy=FSDP, devices=1, max_steps=2).fit(model, loader)
    assert dist.is_initialized()
    (rows,) = fw.Trainer(**quiet, strategy=FSDP, devices=1).predict(model, loader)[:1]
    assert rows.shape == (16, 9)
    with pytest.raises(ConfigError, match=r"Blocks was sharded by an earlier fsdp call with another layout"):
        fw.Trainer(**quiet, strategy={**FSDP, "sharding_strategy": "SHARD_GRAD_OP"}, devices=1).predict(model, loader)

class OwnParameter(sharded.Blocks):
    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(1))  # owned by the module itself: no reset_parameters


@in_a_copy
def test_a_meta_built_module_that_cannot_initialise_itself_is_refused(monkeypatch):
    monkeypatch.setattr(sharded, "Blocks", OwnParameter)
    with pytest.raises(ConfigError, match=r"OwnParameter: parameters on the meta device and no reset_parameters\(\), "
                                          r"so fsdp cannot initialise their shards"):
        sharded.fit(FSDP, devices=1, max_steps=1, meta=True)

def _with_mae(build_metric_in: str):
    import torch.nn.functional as F
    import torchmetrics

    class WithMAE(sharded.Blocks):
        def __init__(self) -> None:
            super().__init__()
            if build_metric_in == "__init__":
                self.val_mae = torchmetrics.MeanAbsoluteError()

        def configure_model(self) -> None:
            if build_metric_in == "configure_model":
                self.val_mae = torchmetrics.MeanAbsoluteError()

        def validation_step(self, batch, batch_idx):
            x, y = batch
            out = self(x)
            self.val_mae(out, y)
            self.log("val_mae", self.val_mae)
            self.log("val_loss", F.mse_loss(out, y), sync_dist=True)

    return WithMAE


def _fit_mae(cls, strategy, meta: bool, tmp_path):
    import contextlib

    from torch.utils.data import DataLoader

    import framework as fw

    trainer = fw.Trainer(**{**sharded.QUIET, "enable_checkpointing": False, "default_root_dir": str(tmp_path)},
                         strategy=strategy, devices=1, max_steps=4)
    with trainer.init_module() if meta else contextlib.nullcontext():
        model = cls()
    trainer.fit(model, DataLoader(sharded.data(64), batch_size=16), DataLoader(sharded.data(32), batch_size=16))
    return float(trainer.callback_metrics["val_mae"])


@in_a_copy
def test_torchmetrics_under_a_meta_built_model(tmp_path):
    """A metric built on the meta device has no starting values: refused by name. One built in
    configure_model (a real device) keeps its state through the model's materialisation, and
    its value is the one-process one."""
    with pytest.raises(ConfigError, match=r"val_mae \(MeanAbsoluteError\): a torchmetrics metric built on the meta "
                                          r"device has no starting values"):
        _fit_mae(_with_mae("__init__"), FSDP, True, tmp_path)
    sharded_mae = _fit_mae(_with_mae("configure_model"), FSDP, True, tmp_path)
    assert sharded_mae == pytest.approx(_fit_mae(_with_mae("configure_model"), "single", False, tmp_path), abs=1e-6)
