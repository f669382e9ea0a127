"""Lightning's own demo classes (``pytorch_lightning.demos.boring_classes``: BoringModel,
BoringDataModule, BoringDataModuleNoLen, ManualOptimBoringModel, DemoModel), their source with
only the imports changed, on fw beside Lightning 2.6: the same weights bit for bit, the same
metrics and predictions, and the same values of the Trainer names Lightning code reads during a
run (``fit_loop.epoch_progress``, ``num_val_batches``, ``val_check_batch``, ``precision``, ...),
in 32-true, 64-true and bf16-true. Then the module, DataModule and optimizer names beside
Lightning's."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import framework as fw
from framework.errors import CheckpointError, ConfigError
from lightning.boring_run import demo_classes, run_cases

pytestmark = pytest.mark.skipif(importlib.util.find_spec("pytorch_lightning") is None,
                                reason="pytorch_lightning is not installed (a test-only dependency: "
                                       "pip install -e '.[dev]')")
QUIET = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)


@pytest.fixture(scope="module")
def both_runs():
    return {which: run_cases(which) for which in ("lightning", "fw")}


CASES = ("boring", "datamodule", "manual", "demo", "no_len", "64-true", "bf16-true", "interval")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", CASES)
def test_lightnings_demo_classes_give_lightnings_numbers(both_runs, case):
    theirs, ours = both_runs["lightning"][case], both_runs["fw"][case]
    assert ours["state"].keys() == theirs["state"].keys()
    for key, value in theirs["state"].items():
        assert ours["state"][key].dtype == value.dtype and torch.equal(ours["state"][key], value), key
    for key in ("step", "epoch", "after", "metrics", "before", "validate", "test", "datamodule_trainer"):
        assert ours.get(key) == theirs.get(key), key
    if "predict" in theirs:
        assert torch.equal(ours["predict"], theirs["predict"])
    assert ours["seen"].keys() == theirs["seen"].keys()
    for hook, values in theirs["seen"].items():
        assert ours["seen"][hook] == values, hook


def test_what_the_cases_cover(both_runs):
    """The comparison above is not of empty runs: the cases train, validate and read the names."""
    ours = both_runs["fw"]
    assert ours["boring"]["step"] == 128 and ours["boring"]["validate"][0]["val_loss"] > 0
    assert ours["boring"]["seen"]["on_train_epoch_end"][1]["progress"] == (2, 2, 2, 1)
    assert ours["64-true"]["seen"]["on_train_batch_end"][0]["dtype"] == "torch.float64"
    assert ours["bf16-true"]["state"]["layer.weight"].dtype == torch.bfloat16
    assert ours["interval"]["seen"]["on_train_batch_end"][0]["val_check_batch"] == 16
    assert ours["datamodule"]["seen"]["on_test_start"] == [[64]]


def test_a_list_of_training_loaders_is_refused_not_cut_to_its_first():
    demo = demo_classes("fw")
    with pytest.raises(ConfigError, match=r"^IterableBoringDataModule.train_dataloader\(\) gave 2 training loaders; "
                                          r"fw trains on one .*ConcatDataset"):
        fw.Trainer(max_epochs=1, **QUIET).fit(demo.BoringModel(), datamodule=demo.IterableBoringDataModule())


# -- the optimizer, the module, the DataModule ---------------------------------------------------
def test_the_optimizer_wrapper_is_an_instance_of_the_optimizers_class():
    seen = {}

    class Manual(demo_classes("fw").BoringModel):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, batch, batch_idx):
            opt = self.optimizers()
            seen.update(sgd=isinstance(opt, torch.optim.SGD), ours=isinstance(opt, fw.LightningOptimizer),
                        groups=opt.param_groups is opt.optimizer.param_groups, name=type(opt).__name__)
            opt.load_state_dict(opt.state_dict())  # the wrapped optimizer's state, never a copy in the wrapper
            seen["same_after_load"] = opt.param_groups is opt.optimizer.param_groups
            loss = self.step(batch)
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()

    fw.Trainer(max_steps=2, limit_val_batches=0, **QUIET).fit(Manual())
    assert seen == {"sgd": True, "ours": True, "groups": True, "name": "LightningSGD", "same_after_load": True}
    from framework.types import STEP_OUTPUT, OptimizerLRScheduler  # the names Lightning code imports
    assert STEP_OUTPUT is not None and OptimizerLRScheduler is not None


def test_to_torchscript_and_to_onnx_export_what_lightnings_do(tmp_path):
    import onnx
    import pytorch_lightning as pl

    ours, theirs = demo_classes("fw").DemoModel(), demo_classes("lightning").DemoModel()
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(4, 32)
    for model in (ours, theirs):
        model.example_input_array = x
    with pytest.warns(pl.utilities.rank_zero.LightningDeprecationWarning):
        their_scripted = theirs.to_torchscript()
    ours.to_torchscript(file_path=tmp_path / "m.pt")
    assert torch.equal(torch.jit.load(tmp_path / "m.pt")(x), their_scripted(x))
    assert torch.equal(ours.to_torchscript(method="trace")(x), ours(x))
    assert ours.training  # the mode is put back
    ours.to_onnx(tmp_path / "m.onnx", dynamo=False)
    theirs.to_onnx(tmp_path / "l.onnx", dynamo=False)
    graph, their_graph = onnx.load(tmp_path / "m.onnx").graph, onnx.load(tmp_path / "l.onnx").graph
    assert [i.name for i in graph.input] == [i.name for i in their_graph.input]
    assert sorted(t.raw_data for t in graph.initializer) == sorted(t.raw_data for t in their_graph.initializer)
    with pytest.raises(ValueError, match=r"no input to trace with; pass one, or set self.example_input_array"):
        demo_classes("fw").DemoModel().to_onnx(tmp_path / "x.onnx")


def test_strict_loading_false_loads_a_checkpoint_that_lacks_weights(tmp_path):
    BoringModel = demo_classes("fw").BoringModel

    class WithHead(BoringModel):
        def __init__(self):
            super().__init__()
            self.head = torch.nn.Linear(2, 2)  # not in the checkpoint

    trainer = fw.Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=0, **QUIET)
    trainer.fit(BoringModel())
    trainer.save_checkpoint(tmp_path / "m.ckpt")
    model = WithHead()
    assert model.strict_loading is True and not model.on_gpu and model.prepare_data_per_node is True
    with pytest.raises(CheckpointError, match="does not fit this model"):
        fw.Trainer(**QUIET).validate(model, ckpt_path=tmp_path / "m.ckpt")
    model.strict_loading = False
    fw.Trainer(**QUIET).validate(model, ckpt_path=tmp_path / "m.ckpt")
    assert torch.equal(model.layer.weight, trainer.lightning_module.layer.weight)

    class Lenient(WithHead):
        def __init__(self):
            super().__init__()
            self.strict_loading = False

    assert torch.equal(Lenient.load_from_checkpoint(tmp_path / "m.ckpt").layer.weight, model.layer.weight)
    with pytest.raises(ConfigError, match=r"^Lenient.load_from_checkpoint\(strict=True\) contradicts "
                                          r"Lenient.strict_loading=False: give the same value to both, or only one$"):
        Lenient.load_from_checkpoint(tmp_path / "m.ckpt", strict=True)


@dataclass
class Sizes:
    n: int = 8


class Data(fw.DataModule):
    def __init__(self, batch_size: int = 4, sizes: str = "small"):
        self.save_hyperparameters()  # no super().__init__(): allowed, as fw's DataModules have been

    def train_dataloader(self):
        assert self.trainer is not None and self.trainer.datamodule is self
        return DataLoader(torch.randn(16, 32), batch_size=self.hparams.batch_size)  # DemoModel takes bare tensors


def test_a_datamodules_hyperparameters_are_saved_logged_and_rebuilt(tmp_path):
    module = demo_classes("fw").DemoModel(learning_rate=0.01)
    module.save_hyperparameters()  # outside __init__: records nothing, as in Lightning
    data = Data(batch_size=8)
    assert data.hparams == {"batch_size": 8, "sizes": "small"} and data.hparams_initial.batch_size == 8
    from framework.loggers import CSVLogger

    logger = CSVLogger(tmp_path)
    trainer = fw.Trainer(max_epochs=1, logger=logger, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(module, datamodule=data)
    assert trainer.global_step == 2
    trainer.save_checkpoint(tmp_path / "m.ckpt")
    assert torch.load(tmp_path / "m.ckpt", weights_only=False)["datamodule_hyper_parameters"] == data.hparams
    import yaml

    logged = yaml.safe_load(Path(logger.log_dir, "hparams.yaml").read_text())
    assert logged == {"batch_size": 8, "sizes": "small"}  # DemoModel saved none: the DataModule's alone
    rebuilt = Data.load_from_checkpoint(tmp_path / "m.ckpt", sizes="large")
    assert rebuilt.hparams == {"batch_size": 8, "sizes": "large"} and rebuilt.trainer is None


def test_datamodule_from_datasets_is_lightnings():
    import pytorch_lightning as pl

    train, val = TensorDataset(torch.arange(10.0)), TensorDataset(torch.arange(4.0))
    ours = fw.DataModule.from_datasets(train, val, batch_size=3)
    theirs = pl.LightningDataModule.from_datasets(train, val, batch_size=3)
    for name in ("train_dataloader", "val_dataloader"):
        a, b = getattr(ours, name)(), getattr(theirs, name)()
        assert (a.batch_size, type(a.sampler), len(a)) == (b.batch_size, type(b.sampler), len(b)), name


def test_fit_loop_bounds_may_be_changed_between_fits():
    BoringModel = demo_classes("fw").BoringModel
    trainer = fw.Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=1, **QUIET)
    model = BoringModel()
    trainer.fit(model)
    assert trainer.num_val_batches == [1] and trainer.num_sanity_val_batches == [1]
    trainer.fit_loop.max_epochs = 3  # Lightning's way to train on
    assert trainer.max_epochs == 3
    trainer.fit(model)
    assert trainer.current_epoch == 3 and trainer.global_step == 6
