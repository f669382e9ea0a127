"""Lightning code ported by changing its imports only: the idioms of Lightning's examples and
bug-report template run on fw with Lightning's meaning, and give Lightning's numbers."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, subprocess_env
from forked import run_script
from torch.utils.data import DataLoader

import framework as fw
from framework.errors import CheckpointError, ConfigError
from lightning.modules import RandomDataset, make_boring

BoringModel = make_boring(fw.TrainModule)
QUIET = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)

needs_lightning = pytest.mark.skipif(importlib.util.find_spec("pytorch_lightning") is None,
                                     reason="pytorch_lightning is not installed (pip install pytorch-lightning; "
                                            "a test-only dependency)")

COMPARE = """
import sys, torch
sys.path.insert(0, {tests!r})
from lightning.modules import make_boring
which, out = sys.argv[1], sys.argv[2]
# use_distributed_sampler=False: the template's shuffled loader in its own order, Lightning's in one
# process (fw's default is the one order of any number of ranks: docs/lightning.md, "Where fw deliberately differs")
common = dict(max_epochs=3, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
              enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1,
              use_distributed_sampler=False)
if which == "lightning":
    import pytorch_lightning as pl
    pl.seed_everything(7)
    model = make_boring(pl.LightningModule)()
    trainer = pl.Trainer(**common)
else:
    import framework as fw
    fw.seed_everything(7)
    model = make_boring(fw.TrainModule)()
    trainer = fw.Trainer(**common)
trainer.fit(model)
fit_metrics = {{k: float(v) for k, v in trainer.callback_metrics.items()}}
test = trainer.test(model, verbose=False)
torch.save({{"state": model.state_dict(), "step": trainer.global_step, "fit": fit_metrics,
            "test": test, "stages": [getattr(s, "value", s) for s in model.setup_stages]}}, out)
"""


@needs_lightning
@pytest.mark.timeout(60)
def test_the_bug_report_template_gives_lightnings_numbers(tmp_path):
    script = tmp_path / "compare.py"
    script.write_text(COMPARE.format(tests=str(ROOT / "tests")))
    got = {}
    for which in ("fw", "lightning"):  # each in a process of its own, forked from this one
        done = run_script(script, which, str(tmp_path / f"{which}.pt"), env=subprocess_env(), cwd=tmp_path)
        assert done.returncode == 0, done.output
        got[which] = torch.load(tmp_path / f"{which}.pt")
    ours, theirs = got["fw"], got["lightning"]
    assert ours["step"] == theirs["step"] == 48
    for key, value in theirs["state"].items():
        assert torch.equal(ours["state"][key], value), key
    assert ours["fit"] == theirs["fit"]
    assert ours["test"] == theirs["test"]
    assert ours["stages"] == theirs["stages"] == ["fit", "test"]


# -- the module ---------------------------------------------------------------------------------
def test_hparams_are_attributes_and_load_from_checkpoint_rebuilds_the_module(tmp_path):
    model = BoringModel(learning_rate=0.05)
    assert model.hparams.learning_rate == 0.05 and model.hparams["batch_size"] == 4
    model.hparams.learning_rate = 0.2
    assert model.hparams_initial.learning_rate == 0.05
    with pytest.raises(AttributeError, match="hparams has no 'lr'"):
        _ = model.hparams.lr
    trainer = fw.Trainer(max_epochs=1, **QUIET)
    trainer.fit(model)
    path = tmp_path / "m.ckpt"
    trainer.save_checkpoint(path)
    loaded = BoringModel.load_from_checkpoint(path, map_location="cpu", batch_size=8)
    assert loaded.hparams.learning_rate == 0.2 and loaded.hparams.batch_size == 8
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value)


def test_the_modules_own_data_hooks_and_setup_are_used():
    model = BoringModel()
    trainer = fw.Trainer(max_epochs=1, **QUIET)
    trainer.fit(model)  # no loaders given: train_dataloader()/val_dataloader() of the module
    assert model.setup_stages == ["fit"]
    assert trainer.global_step == 16 and "valid_loss" in trainer.callback_metrics
    assert isinstance(trainer.train_dataloader, DataLoader) and isinstance(trainer.val_dataloaders, DataLoader)
    assert trainer.validate(model)[0].keys() == {"valid_loss"}


class Data(fw.DataModule):
    def __init__(self):
        self.prepared = 0

    def prepare_data(self):
        self.prepared += 1

    def train_dataloader(self):
        return DataLoader(RandomDataset(), batch_size=8)

    def val_dataloader(self):
        return DataLoader(RandomDataset(length=16), batch_size=8)


def test_a_datamodule_may_be_given_positionally():
    trainer = fw.Trainer(max_epochs=1, **QUIET)
    data = Data()
    trainer.fit(BoringModel(), data)
    assert data.prepared == 1 and trainer.global_step == 8
    assert trainer.validate(BoringModel(), data)[0].keys() == {"valid_loss"}
    with pytest.raises(ConfigError, match="given twice"):
        trainer.fit(BoringModel(), data, datamodule=data)


def test_module_properties_and_helpers():
    model = BoringModel()
    model.example_input_array = torch.zeros(2, 32)
    assert model.dtype == torch.float32 and model.local_rank == 0 and model.logger is None and model.loggers == []
    model.freeze()
    assert not any(p.requires_grad for p in model.parameters()) and not model.training
    model.unfreeze()
    assert all(p.requires_grad for p in model.parameters()) and model.training
    x = torch.arange(3.0)
    assert model.all_gather(x) is x  # one process: unchanged
    assert torch.equal(model.example_input_array, torch.zeros(2, 32))


def test_configure_callbacks_replaces_the_trainers_callback_of_that_type():
    class Early(BoringModel):
        def configure_callbacks(self):
            return [fw.callbacks.EarlyStopping(monitor="valid_loss", patience=0, min_delta=10.0)]

    trainer = fw.Trainer(max_epochs=5, callbacks=[fw.callbacks.EarlyStopping(monitor="valid_loss", patience=99)],
                         **QUIET)
    trainer.fit(Early())
    assert len(trainer.early_stopping_callbacks) == 1 and trainer.early_stopping_callback.patience == 0
    assert trainer.current_epoch < 5  # the module's callback stopped the run


# -- the trainer --------------------------------------------------------------------------------
def test_trainer_properties_as_lightning_names_them():
    seen = {}

    class Watch(fw.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            seen.setdefault("last", []).append(trainer.is_last_batch)
            seen["outputs"] = outputs

        def on_validation_start(self, trainer, module):
            seen["validating"] = trainer.validating

        def on_test_start(self, trainer, module):
            seen["testing"] = trainer.testing

    trainer = fw.Trainer(max_epochs=2, limit_train_batches=4, callbacks=[Watch()], logger=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=".")
    model = BoringModel()
    trainer.fit(model)
    assert seen["last"] == [False, False, False, True] * 2
    assert seen["validating"] is True
    assert trainer.estimated_stepping_batches == 8
    assert trainer.num_devices == 1 and trainer.device_ids == [0] and trainer.node_rank == 0
    assert trainer.checkpoint_callback is trainer.checkpoint_callbacks[0] and trainer.early_stopping_callback is None
    assert trainer.progress_bar_callback is None and not trainer.interrupted
    out = seen["outputs"]
    assert isinstance(out, dict) and not out["loss"].requires_grad  # detached, as Lightning hands it on
    saved = trainer.checkpoint_callback.best_model_path  # without monitor: the newest one
    assert saved.endswith(".ckpt")
    trainer.test(model, ckpt_path=saved)
    assert seen["testing"] is True and trainer.ckpt_path == saved


def test_ckpt_path_best_is_the_checkpoint_callbacks_best():
    trainer = fw.Trainer(max_epochs=3, logger=False, enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=".",
                         callbacks=[fw.callbacks.ModelCheckpoint(monitor="valid_loss", save_top_k=1)])
    model = BoringModel()
    trainer.fit(model)
    best = trainer.checkpoint_callback.best_model_path
    assert best
    trainer.validate(model, ckpt_path="best")
    assert trainer.ckpt_path == best
    fresh = fw.Trainer(**QUIET)  # the same folder: the best an earlier run recorded (fw test ckpt_path=best)
    fresh.validate(BoringModel(), ckpt_path="best")
    assert fresh.ckpt_path == best
    with pytest.raises(CheckpointError, match=r"^ckpt_path='best': no ModelCheckpoint of this Trainer or of a run "
                                              r"under elsewhere recorded a best checkpoint"):
        fw.Trainer(default_root_dir="elsewhere", **QUIET).validate(BoringModel(), ckpt_path="best")


def test_no_validation_step_means_no_validation_loop_and_sanity_settings_mean_lightnings():
    calls = []

    class NoVal(BoringModel):
        validation_step = fw.TrainModule.validation_step  # as if never defined

    class Count(fw.Callback):
        def on_validation_batch_start(self, trainer, module, batch, batch_idx, dataloader_idx=0):
            calls.append(trainer.sanity_checking)

    trainer = fw.Trainer(max_epochs=1, callbacks=[Count()], **QUIET)
    with pytest.warns(UserWarning, match="has no validation_step"):
        trainer.fit(NoVal())
    assert calls == []
    fw.Trainer(max_epochs=1, limit_val_batches=0, callbacks=[Count()], **QUIET).fit(BoringModel())
    assert calls == []  # limit_val_batches=0: no validation, no sanity check either
    fw.Trainer(max_epochs=1, limit_train_batches=1, num_sanity_val_steps=-1, callbacks=[Count()], **QUIET).fit(
        BoringModel())
    assert calls == [True] * 5 + [False] * 5  # -1: the sanity check runs every validation batch


def test_predict_returns_a_list_per_loader_and_nothing_when_asked():
    class Pred(BoringModel):
        def predict_step(self, batch, batch_idx, dataloader_idx=0):
            return dataloader_idx

    trainer = fw.Trainer(**QUIET)
    loaders = [DataLoader(RandomDataset(length=8), batch_size=4), DataLoader(RandomDataset(length=4), batch_size=4)]
    assert trainer.predict(Pred(), loaders) == [[0, 0], [1]]
    assert trainer.predict(Pred(), loaders[0]) == [0, 0]
    assert trainer.predict(Pred(), loaders, return_predictions=False) is None


def test_fast_dev_run_runs_one_batch_of_each_stage_and_writes_nothing(tmp_path):
    trainer = fw.Trainer(fast_dev_run=True, default_root_dir=str(tmp_path), enable_progress_bar=False,
                         enable_model_summary=False)
    model = BoringModel()
    trainer.fit(model)
    assert trainer.global_step == 1 and trainer.current_epoch == 1
    # Lightning's: the default ModelCheckpoint stays, idle, and the logs go to a DummyLogger
    assert trainer.checkpoint_callback is not None and trainer.checkpoint_callback.best_model_path == ""
    assert [type(lg).__name__ for lg in trainer.loggers] == ["DummyLogger"] and trainer.log_dir is None
    assert trainer.test(model)[0].keys() == {"test_loss"}
    assert not any(tmp_path.rglob("*.ckpt")) and not any(tmp_path.rglob("events.*"))


def test_overfit_batches_trains_on_the_same_first_batches_every_epoch():
    seen = []

    class Record(BoringModel):
        def training_step(self, batch):
            seen.append(batch.sum().item())
            return super().training_step(batch)

    fw.Trainer(max_epochs=2, overfit_batches=2, **QUIET).fit(Record())
    assert len(seen) == 4 and seen[:2] == seen[2:]
    first = RandomDataset()[0:4].sum().item()
    assert seen[0] == pytest.approx(first)  # in order: the shuffle is turned off


def test_reload_dataloaders_every_n_epochs_asks_again():
    calls = []

    class Reload(BoringModel):
        def train_dataloader(self):
            calls.append(self.current_epoch)
            return super().train_dataloader()

    fw.Trainer(max_epochs=4, reload_dataloaders_every_n_epochs=2, limit_train_batches=1, **QUIET).fit(Reload())
    assert calls == [0, 2]


def test_speed_and_debug_switches_mean_what_they_mean_in_lightning():
    before = torch.backends.cudnn.benchmark
    seen = {}

    class Look(BoringModel):
        def on_train_start(self):
            seen["benchmark"] = torch.backends.cudnn.benchmark

        def validation_step(self, batch, batch_idx):
            seen["inference"] = torch.is_inference_mode_enabled()
            return super().validation_step(batch, batch_idx)

    fw.Trainer(max_epochs=1, limit_train_batches=1, benchmark=not before, **QUIET).fit(Look())
    assert seen == {"benchmark": not before, "inference": True} and torch.backends.cudnn.benchmark is before
    fw.Trainer(max_epochs=1, limit_train_batches=1, inference_mode=False, **QUIET).fit(Look())
    assert seen["inference"] is False

    class NaNBackward(BoringModel):
        def training_step(self, batch):
            return {"loss": torch.sqrt(-self(batch).abs().sum() - 1)}

    with pytest.raises(RuntimeError, match=r"returned nan values|Function .* returned nan"):
        fw.Trainer(max_epochs=1, detect_anomaly=True, on_nonfinite="warn", **QUIET).fit(NaNBackward())


def test_barebones_and_the_model_summary(capfd):
    model = BoringModel()
    model.example_input_array = torch.zeros(3, 32)
    fw.Trainer(max_epochs=1, limit_train_batches=2, logger=False, enable_checkpointing=False,
               enable_progress_bar=False).fit(model)
    err = capfd.readouterr().err
    assert "layer" in err and "Linear" in err and "[3, 32]" in err and "[3, 2]" in err and "66 total params" in err
    trainer = fw.Trainer(max_epochs=1, limit_train_batches=2, barebones=True)
    trainer.fit(BoringModel())
    assert trainer.loggers == [] and trainer.checkpoint_callback is None and trainer.progress_bar_callback is None
    assert "Linear" not in capfd.readouterr().err  # no summary


@pytest.mark.parametrize(("spec", "error"), [
    ({"profiler": "xla"}, "trainer.profiler='xla': use one of simple, advanced, pytorch"),
    ({"fast_dev_run": -1}, "trainer.fast_dev_run=-1"),
    ({"strategy": "ddp_sharded"}, "known: .*auto.*ddp,.*single_device"),
])
def test_what_fw_has_no_equivalent_for_is_refused_saying_what_to_use(spec, error):
    with pytest.raises(ConfigError, match=error):
        fw.Trainer(**spec)


def test_lightnings_strategy_names():
    assert fw.Trainer(strategy="single_device").strategy.name == "single"
    strategy = fw.Trainer(strategy="ddp_find_unused_parameters_true", devices=1, accelerator="cpu").strategy
    assert strategy.name == "ddp_gloo" and strategy.ddp_kwargs["find_unused_parameters"] is True


def test_sync_batchnorm_on_the_cpu_is_refused_not_ignored():
    with pytest.raises(ConfigError, match="sync_batchnorm=true needs GPUs"):
        fw.Trainer(strategy="ddp_gloo", devices=1, sync_batchnorm=True, **QUIET).fit(BoringModel())


SPAWN = """
import sys, torch
sys.path.insert(0, {tests!r})
import framework as fw
from toy import LinearModel, loader, regression_data

def main():
    fw.seed_everything(0)
    model = LinearModel(lr=0.05)
    trainer = fw.Trainer(accelerator="cpu", devices=2, strategy=sys.argv[1], max_epochs=2, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, loader(regression_data(32), 4))
    torch.save({{"state": model.state_dict(), "metrics": dict(trainer.callback_metrics),
                "step": trainer.global_step, "world": trainer.world_size}}, sys.argv[2])
    if sys.argv[1] == "ddp_notebook":  # a checkpoint saved here after the fit resumes as the fit never stopped
        def fit(epochs, ckpt_path=None):
            model = LinearModel(lr=0.05, optimizer="adam")
            trainer = fw.Trainer(accelerator="cpu", devices=2, strategy=sys.argv[1], max_epochs=epochs, logger=False,
                                 enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
            trainer.fit(model, loader(regression_data(32), 4), ckpt_path=ckpt_path)
            return trainer, model
        whole = fit(2)[1]
        trainer = fit(1)[0]
        trainer.save_checkpoint(sys.argv[2] + ".ckpt")
        resumed = fit(2, sys.argv[2] + ".ckpt")[1]
        torch.save({{"whole": whole.state_dict(), "resumed": resumed.state_dict()}}, sys.argv[2] + ".resume")

if __name__ == "__main__":
    main()
"""


@pytest.mark.timeout(120)  # ddp_notebook: 30 s alone, 53-60 s in the full suite
@pytest.mark.parametrize(("strategy", "stdin"), [("ddp_spawn", False), ("ddp_notebook", True)])
def test_spawned_workers_train_and_the_caller_gets_the_weights_and_metrics(tmp_path, strategy, stdin):
    """ddp_spawn from a script; ddp_notebook from ``python -`` (no file to re-run or import)."""
    from toy import LinearModel, loader, regression_data

    script = SPAWN.format(tests=str(ROOT / "tests"))
    out = tmp_path / "out.pt"
    if stdin:
        cmd, given = [sys.executable, "-", strategy, str(out)], script
    else:
        (tmp_path / "job.py").write_text(script)
        cmd, given = [sys.executable, str(tmp_path / "job.py"), strategy, str(out)], None
    proc = subprocess.run(cmd, input=given, env=subprocess_env(), capture_output=True, text=True, timeout=100,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = torch.load(out)
    assert got["step"] == 8 and "train/loss_epoch" in got["metrics"]
    fw.seed_everything(0)
    single = LinearModel(lr=0.05)
    fw.Trainer(max_epochs=2, **QUIET).fit(single, loader(regression_data(32), 8))
    for key, value in single.state_dict().items():
        torch.testing.assert_close(got["state"][key], value, atol=1e-5, rtol=0)
    if strategy == "ddp_notebook":  # the workers' optimizer state and both ranks' RNG came back for it
        saved, resume = torch.load(f"{out}.ckpt", weights_only=False), torch.load(f"{out}.resume")
        assert saved["optimizer_states"][0]["state"] and len(saved["rng"]) == 2 and saved["global_step"] == 4
        for key, value in resume["whole"].items():
            assert torch.equal(resume["resumed"][key], value), key


ROWS = """
import sys, torch
sys.path.insert(0, {tests!r})
from lightning.modules import gan_loader, make_boring, make_gan
which, model_name, out = sys.argv[1], sys.argv[2], sys.argv[3]
rows = []
if which == "lightning":
    import pytorch_lightning as pl
    from pytorch_lightning.loggers.logger import Logger
    pl.seed_everything(7); Base, Trainer = pl.LightningModule, pl.Trainer
else:
    import framework as fw
    from framework.loggers import Logger
    fw.seed_everything(7); Base, Trainer = fw.TrainModule, fw.Trainer

class Rows(Logger):
    name, version = "rows", 0
    def log_metrics(self, metrics, step=None):
        rows.append((step, {{k: round(float(v), 6) for k, v in metrics.items()}}))
    def log_hyperparams(self, *args, **kwargs):
        pass

if model_name == "gan":
    model, data = make_gan(Base)(), [gan_loader(8)]
else:
    class Boring(make_boring(Base)):
        def training_step(self, batch):
            out = super().training_step(batch)
            self.log("both", out["loss"], on_step=True, on_epoch=True)
            return out
    model, data = Boring(), []
trainer = Trainer(logger=Rows(), max_epochs=2, accelerator="cpu", devices=1, enable_checkpointing=False,
                  enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=3, limit_train_batches=7,
                  limit_val_batches=2, use_distributed_sampler=False)  # the loader's own order, as Lightning's
trainer.fit(model, *data)
results = trainer.validate(model, verbose=False) if model_name != "gan" else []
torch.save({{"rows": rows, "results": results}}, out)
"""


@needs_lightning
@pytest.mark.timeout(60)
@pytest.mark.parametrize("model", ["boring", "gan"])
def test_logged_rows_fall_on_lightnings_steps_with_lightnings_names(tmp_path, model):
    """``log_every_n_steps`` rows at the same steps (Lightning labels a row with the batches
    that stepped before it), no extra step row at an epoch's end, epoch rows with ``x_epoch``
    only, and validate() results without the plain alias; manual optimization counts batches."""
    script = tmp_path / "rows.py"
    script.write_text(ROWS.format(tests=str(ROOT / "tests")))
    got = {}
    for which in ("fw", "lightning"):  # each in a process of its own, forked from this one
        out = tmp_path / f"{which}.pt"
        done = run_script(script, which, model, str(out), env=subprocess_env(), cwd=tmp_path)
        assert done.returncode == 0, done.output
        got[which] = torch.load(out)
    assert got["fw"]["rows"] == got["lightning"]["rows"]
    assert got["fw"]["results"] == got["lightning"]["results"]
    assert len(got["fw"]["rows"]) >= 4


def test_lightning_cli_is_refused_with_what_to_use():
    with pytest.raises(ImportError, match=r"fw has no LightningCLI.*fw fit conf/x.yaml"):
        from framework.cli import LightningCLI  # noqa: F401


def test_the_modules_own_evaluation_hooks_run_with_lightnings_arguments():
    calls = []

    class Hooked(BoringModel):
        def on_validation_start(self):
            calls.append("validation_start")

        def on_validation_batch_end(self, outputs, batch, batch_idx, dataloader_idx=0):
            calls.append(("val_batch", batch_idx, dataloader_idx))

        def on_test_end(self):
            calls.append("test_end")

        def on_predict_batch_start(self, batch, batch_idx, dataloader_idx=0):
            calls.append(("predict_batch", batch_idx, dataloader_idx))

        def predict_step(self, batch, batch_idx, dataloader_idx=0):
            return self(batch)

    model, trainer = Hooked(), fw.Trainer(**QUIET)
    two = [DataLoader(RandomDataset(length=4), batch_size=4), DataLoader(RandomDataset(length=8), batch_size=4)]
    trainer.validate(model, two)
    trainer.test(model)
    trainer.predict(model, two[0])
    assert calls == ["validation_start", ("val_batch", 0, 0), ("val_batch", 0, 1), ("val_batch", 1, 1), "test_end",
                     ("predict_batch", 0, 0)]
