"""The exact words of the messages a newcomer meets first: each names the key or value and says
what to do (issue 20's list), in one process."""

from __future__ import annotations

import logging

import pytest
import torch
from conftest import ROOT
from toy import QUIET, LinearModel, loader, regression_data

import framework as fw
from framework.callbacks import EarlyStopping, EarlyStoppingReason
from framework.cli import main
from framework.config import instantiate, load_recipe
from framework.errors import CheckpointError, ConfigError


def cli_error(capsys, *argv: str) -> str:
    assert main(list(argv)) == 2
    return capsys.readouterr().err.strip()


def test_cli_messages(capsys, tmp_path):
    assert cli_error(capsys, "fit") == ("fw: error: fw fit needs a recipe: fw fit RECIPE.yaml [key=value ...] "
                                        "(e.g. fw fit conf/digits.yaml)")
    (tmp_path / "a.yaml").write_text("module: {}\n")
    assert cli_error(capsys, "fit", str(tmp_path)) == (f"fw: error: recipe '{tmp_path}' is a directory; give the path "
                                                       f"of a YAML file in it ({tmp_path / 'a.yaml'})")


def test_recipe_messages():
    with pytest.raises(ConfigError) as err:
        load_recipe(ROOT / "conf" / "digits.yaml", ["trainer.callbacks=[]"])
    assert str(err.value) == ("override: 'trainer.callbacks' is a top-level key of the recipe: write callbacks=... "
                              "(e.g. callbacks=[] or +callbacks={_target_: ...}), not trainer.callbacks=...")
    with pytest.raises(ConfigError) as err:
        instantiate({"_target_": "framework.loggers.CsvLogger"}, "logger")
    assert str(err.value).startswith("logger._target_: 'framework.loggers' has no 'CsvLogger' (did you mean 'CSVLogger'?)")


def test_log_of_a_string_names_the_key():
    class LogsText(LinearModel):
        def training_step(self, batch, batch_idx):
            self.log("name", "abc")
            return super().training_step(batch, batch_idx)

    with pytest.raises(ValueError, match="the value must be a number") as err:
        fw.Trainer(max_steps=1, **QUIET).fit(LogsText(), loader(regression_data()))
    assert str(err.value) == ("self.log('name', 'abc'): the value must be a number, a one-element tensor or a "
                              "torchmetrics Metric, not str")


def test_a_module_without_configure_optimizers_or_training_step():
    class NoOptimizer(fw.TrainModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            return self.net(batch[0]).mean()

    class NoStep(fw.TrainModule):
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    with pytest.raises(ConfigError) as err:
        fw.Trainer(max_steps=1, **QUIET).fit(NoOptimizer(), loader(regression_data()))
    assert str(err.value) == ("NoOptimizer has no configure_optimizers(): fit needs one, e.g. def "
                              "configure_optimizers(self): return torch.optim.Adam(self.parameters(), lr=1e-3)")
    with pytest.raises(ConfigError) as err:
        fw.Trainer(max_steps=1, **QUIET).fit(NoStep(), loader(regression_data()))
    assert str(err.value) == ("NoStep has no training_step(): fit needs one, e.g. def training_step(self, batch, "
                              "batch_idx): return the loss")


def test_a_checkpoint_of_another_model_is_not_said_to_be_loaded(tmp_path, caplog):
    trainer = fw.Trainer(max_steps=2, default_root_dir=tmp_path, **{**QUIET, "enable_checkpointing": True})
    trainer.fit(LinearModel(), loader(regression_data()))
    path = trainer.checkpoint_callback.last_model_path or trainer.checkpoint_callback.best_model_path
    caplog.set_level(logging.INFO)
    with pytest.raises(CheckpointError, match="does not fit this model"):
        fw.Trainer(**QUIET).validate(LinearModel(features=3), loader(regression_data(features=3)), ckpt_path=path)
    assert "loaded" not in caplog.text


def test_val_check_interval_beyond_the_epoch_is_refused():
    data = loader(regression_data(n=256))  # 32 batches
    with pytest.raises(ConfigError) as err:
        fw.Trainer(max_epochs=1, val_check_interval=1000, **QUIET).fit(LinearModel(), data, loader(regression_data()))
    assert str(err.value) == ("trainer.val_check_interval=1000 is more than the 32 training batches of an epoch, so it "
                              "would never validate: give at most that many, set check_val_every_n_epoch=null to "
                              "count batches across epochs, or limit_val_batches=0 to skip validation")
    fw.Trainer(max_epochs=1, val_check_interval=1000, limit_val_batches=0, **QUIET).fit(LinearModel(), data)


def test_the_last_line_of_a_fit_says_why_it_stopped(caplog):
    caplog.set_level(logging.INFO)
    stop = EarlyStopping(monitor="val/loss", patience=1, min_delta=10.0)
    trainer = fw.Trainer(max_epochs=20, callbacks=[stop], **QUIET)
    trainer.fit(LinearModel(), loader(regression_data()), loader(regression_data(seed=1)))
    assert stop.stopping_reason is EarlyStoppingReason.PATIENCE_EXHAUSTED
    done = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("fw fit: done"))
    best = f"{stop.best_score:.4g}"
    assert done == (f"fw fit: done at step {trainer.global_step}, stopped by EarlyStopping: val/loss did not improve "
                    f"by more than 10.0 for 1 checks; best {best}")
    assert stop.state_dict()["stopping_reason"] == EarlyStoppingReason.PATIENCE_EXHAUSTED.value
    caplog.clear()
    fw.Trainer(max_epochs=2, **QUIET).fit(LinearModel(), loader(regression_data()))
    assert any(r.getMessage() == "fw fit: done at step 16, max_epochs=2 reached" for r in caplog.records)


def test_deepspeed_is_refused_with_what_to_use():
    with pytest.raises(ConfigError) as err:
        fw.Trainer(strategy="deepspeed_stage_2", **QUIET)
    assert str(err.value) == ("trainer.strategy: fw has no 'deepspeed_stage_2' strategy; use strategy=fsdp, which "
                              "shards parameters, gradients and optimizer state over the ranks as DeepSpeed's ZeRO "
                              "stage 3 does (sharding_strategy=SHARD_GRAD_OP for stage 2)")


def test_lightning_1x_names_get_today_s_spelling(capsys):
    """Lightning 1.x's ``gpus`` (a Trainer argument, as an override) and ``ddp_cpu``: the line says
    what to write today, and suggests no strategy this CPU machine cannot run (ddp_nccl)."""
    for override in ("trainer.gpus=1", "gpus=1"):
        line = cli_error(capsys, "fit", str(ROOT / "conf" / "digits.yaml"), override)
        key = override.split("=")[0]
        assert line.startswith(f"fw: error: override: '{key}' is Lightning 1.x's"), line
        assert line.endswith("today's spelling: trainer.accelerator=gpu trainer.devices=N "
                             "(Trainer(accelerator='gpu', devices=N))"), line
    with pytest.raises(ConfigError) as err:
        fw.Trainer(accelerator="cpu", strategy="ddp_cpu")
    assert str(err.value) == ("trainer.strategy: fw has no 'ddp_cpu' strategy; Lightning 1.x's ddp_cpu is "
                              "trainer.strategy=ddp_gloo (DDP over Gloo: one process per CPU device, "
                              "trainer.accelerator=cpu trainer.devices=N)")
    with pytest.raises(ConfigError, match=r"unknown strategy 'ddp_ncl' \(did you mean 'ddp_gloo'\?\)"):
        fw.Trainer(accelerator="cpu", strategy="ddp_ncl")
