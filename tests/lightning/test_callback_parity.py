"""Callbacks as Lightning's, found by a third side-by-side sweep (fw and pytorch_lightning on the
same module, seed and arguments): EarlyStopping decides where to check as Lightning does (at the
training epoch's end when validation runs once an epoch, else after each validation, never on a
stale value), and saves and restores its patience; ModelCheckpoint keeps a ``last.ckpt`` an
earlier run left (``last-v1.ckpt``), and refuses ``every_n_train_steps`` with ``every_n_epochs``;
the scores are tensors and the public attributes Lightning code reads (``lrs``, ``monitor_op``,
``to_yaml``, ``file_exists``, ...) are there, with Lightning's values."""

from __future__ import annotations

import os

import pytest
import yaml

import framework as fw
import framework.callbacks as fw_callbacks
from framework.errors import ConfigError
from lightning.modules import QUIET, make_regressor, regression_loader

pl = pytest.importorskip("pytorch_lightning")
SIDES = [("fw", fw, fw.TrainModule, fw_callbacks), ("lightning", pl, pl.LightningModule, pl.callbacks)]


def _scripted(Base, values: list[float]):
    """The regressor, whose validation logs ``val_loss`` = ``values[current_epoch]``."""
    class Scripted(make_regressor(Base)):
        def validation_step(self, batch, batch_idx):
            self.log("val_loss", values[self.current_epoch])

    return Scripted()


@pytest.mark.timeout(60)
def test_early_stopping_checks_after_each_validation_only_when_validating_every_other_epoch():
    # validation after epochs 1, 3, 5 (0-indexed): 1.0, then 0.9 (better), then 0.95 (worse):
    # Lightning stops at epoch 5; counting the stale 1.0 at the end of epoch 2 stopped at epoch 2
    values = [9.0, 1.0, 9.0, 0.9, 9.0, 0.95, 9.0, 0.8]
    seen = {}
    for name, lib, base, callbacks in SIDES:
        stopping = callbacks.EarlyStopping("val_loss", patience=1)
        trainer = lib.Trainer(**{**QUIET, "max_epochs": 8, "logger": False}, check_val_every_n_epoch=2,
                              callbacks=[stopping])
        model = _scripted(base, values)
        trainer.fit(model, regression_loader(), regression_loader())
        seen[name] = (trainer.global_step, trainer.current_epoch, stopping.stopped_epoch, stopping.wait_count,
                      float(stopping.best_score), model.layer.weight.detach().clone())
    assert seen["fw"][:5] == seen["lightning"][:5] == (24, 6, 5, 1, pytest.approx(0.9))
    assert seen["fw"][5].equal(seen["lightning"][5])


@pytest.mark.timeout(60)
def test_early_stopping_restores_its_patience_from_the_checkpoint_as_lightning(tmp_path):
    seen = {}
    for name, lib, base, callbacks in SIDES:
        root = tmp_path / name
        first = lib.Trainer(**{**QUIET, "max_epochs": 1, "logger": False, "enable_checkpointing": True},
                            default_root_dir=root, callbacks=[callbacks.EarlyStopping("val_loss", patience=1),
                                                              callbacks.ModelCheckpoint(root / "ck", save_last=True)])
        first.fit(_scripted(base, [1.0] * 10), regression_loader(), regression_loader())
        stopping = callbacks.EarlyStopping("val_loss", patience=5)
        again = lib.Trainer(**{**QUIET, "max_epochs": 10, "logger": False}, default_root_dir=root,
                            callbacks=[stopping])
        again.fit(_scripted(base, [1.0] * 10), regression_loader(), regression_loader(),
                  ckpt_path=str(root / "ck" / "last.ckpt"))
        seen[name] = (stopping.patience, again.current_epoch, again.global_step, stopping.stopped_epoch)
    assert seen["fw"] == seen["lightning"] == (1, 2, 8, 1)


def test_early_stopping_resumes_from_a_checkpoint_fw_wrote_before_it_saved_the_patience():
    stopping = fw_callbacks.EarlyStopping("val_loss", patience=4)
    stopping.load_state_dict({"wait_count": 2, "stopped_epoch": 0, "best_score": 0.5, "stopping_reason": 0})
    assert (stopping.patience, stopping.wait_count, float(stopping.best_score)) == (4, 2, 0.5)
    assert stopping.best_score.dtype == pl.callbacks.EarlyStopping("x").best_score.dtype


@pytest.mark.timeout(60)
def test_a_last_ckpt_an_earlier_run_left_is_kept_as_lightning_keeps_it(tmp_path):
    seen = {}
    for name, lib, base, callbacks in SIDES:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "last.ckpt").write_bytes(b"an earlier run's")
        checkpoint = callbacks.ModelCheckpoint(folder, save_last=True)
        lib.Trainer(**{**QUIET, "logger": False, "enable_checkpointing": True}, callbacks=[checkpoint]).fit(
            _scripted(base, [1.0] * 4), regression_loader(), regression_loader())
        seen[name] = (sorted(f for f in os.listdir(folder) if not f.startswith(".")), os.path.basename(checkpoint.last_model_path),
                      (folder / "last.ckpt").read_bytes())
    assert seen["fw"] == seen["lightning"]
    assert seen["fw"][1:] == ("last-v1.ckpt", b"an earlier run's")


def test_every_n_train_steps_with_every_n_epochs_is_refused_as_in_lightning():
    # fw saved by steps and ignored every_n_epochs without a word
    for callbacks, error in ((fw_callbacks, ConfigError), (pl.callbacks, Exception)):
        with pytest.raises(error, match="mutually exclusive"):
            callbacks.ModelCheckpoint(every_n_train_steps=2, every_n_epochs=2)


@pytest.mark.timeout(60)
def test_what_lightning_code_reads_of_the_callbacks_is_there_and_the_same(tmp_path):
    seen = {}
    for name, lib, base, callbacks in SIDES:
        checkpoint = callbacks.ModelCheckpoint(tmp_path / name, monitor="val_loss", save_top_k=2)
        stopping = callbacks.EarlyStopping("val_loss", patience=5)
        rates = callbacks.LearningRateMonitor(log_momentum=True, log_weight_decay=True)
        trainer = lib.Trainer(**{**QUIET, "max_epochs": 3, "enable_checkpointing": True, "log_every_n_steps": 2},
                              default_root_dir=tmp_path / name, callbacks=[checkpoint, stopping, rates])
        trainer.fit(_scripted(base, [3.0, 1.0, 2.0]), regression_loader(), regression_loader())
        checkpoint.to_yaml()
        with open(tmp_path / name / "best_k_models.yaml") as fp:
            best_k = {os.path.basename(path): score for path, score in yaml.safe_load(fp).items()}
        scores = (checkpoint.best_model_score, checkpoint.current_score, checkpoint.kth_value, stopping.best_score,
                  *checkpoint.best_k_models.values())
        seen[name] = (best_k, [(type(x).__name__, x.dtype, float(x)) for x in scores],
                      checkpoint.file_exists(checkpoint.best_model_path, trainer),
                      checkpoint.file_exists(str(tmp_path / "none.ckpt"), trainer),
                      stopping.monitor_op, stopping.mode_dict, stopping.order_dict,
                      rates.lrs, rates.last_momentum_values, rates.last_weight_decay_values)
    assert seen["fw"] == seen["lightning"]
    assert seen["fw"][0] == {"epoch=1-step=8.ckpt": 1.0, "epoch=2-step=12.ckpt": 2.0}


def _tested(Base):
    class Tested(make_regressor(Base)):
        def test_step(self, batch, batch_idx):
            self.log("test_loss", self.mse(batch))

    return Tested()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", ["another-runs-checkpoint", "an-older-checkpoint-of-this-fit"])
def test_last_after_a_fit_is_this_fits_last_ckpt_or_the_weights_in_memory_as_in_lightning(tmp_path, case):
    # fw took the newest checkpoint of any run under default_root_dir: another run's weights, or
    # an epoch-2 file after a 3-epoch fit, tested in place of the weights the fit ended with
    seen = {}
    for name, lib, base, callbacks in SIDES:
        root = tmp_path / name
        quiet = {**QUIET, "logger": False, "default_root_dir": root}
        if case == "another-runs-checkpoint":
            lib.Trainer(**{**quiet, "enable_checkpointing": True}).fit(_tested(base), regression_loader())
            trainer = lib.Trainer(**quiet, max_steps=6)
        else:
            trainer = lib.Trainer(**{**quiet, "max_epochs": 3, "enable_checkpointing": True},
                                  callbacks=[callbacks.ModelCheckpoint(root, every_n_epochs=2, save_top_k=-1)])
        model = _tested(base)
        trainer.fit(model, regression_loader())
        trained = model.layer.weight.detach().clone()
        with pytest.warns(UserWarning, match="last"):
            result = trainer.test(model, regression_loader(), ckpt_path="last", verbose=False)
        seen[name] = (trainer.ckpt_path, result, model.layer.weight.equal(trained))
    assert seen["fw"] == seen["lightning"]
    assert seen["fw"][0] is None and seen["fw"][2]


@pytest.mark.timeout(60)
def test_a_fast_dev_run_keeps_the_callbacks_idle_and_logs_to_a_dummy_logger_as_in_lightning(tmp_path):
    # fw took ModelCheckpoint, EarlyStopping and LearningRateMonitor out and ran without a logger:
    # trainer.checkpoint_callback and self.logger were None, and a module's logger call failed
    seen = {}
    for name, lib, base, callbacks in SIDES:
        class UsesItsLogger(make_regressor(base)):
            def validation_step(self, batch, batch_idx):
                self.log("val_loss", self.mse(batch))
                self.logger.experiment.add_scalar("by_hand", 1.0, self.global_step)

        root = tmp_path / name
        trainer = lib.Trainer(accelerator="cpu", devices=1, fast_dev_run=2, default_root_dir=root,
                              enable_progress_bar=False, enable_model_summary=False,
                              callbacks=[callbacks.ModelCheckpoint(monitor="val_loss"),
                                         callbacks.EarlyStopping("val_loss", patience=0),
                                         callbacks.LearningRateMonitor()])
        model = UsesItsLogger()
        trainer.fit(model, regression_loader(), regression_loader())
        kinds = sorted(type(cb).__name__ for cb in trainer.callbacks
                       if type(cb).__name__ in ("ModelCheckpoint", "EarlyStopping", "LearningRateMonitor"))
        seen[name] = (kinds, trainer.checkpoint_callback.best_model_path, trainer.early_stopping_callback.wait_count,
                      [type(lg).__name__ for lg in trainer.loggers], trainer.logger.name, trainer.logger.version,
                      trainer.log_dir, trainer.global_step, sorted(p.name for p in root.rglob("*")) if root.exists() else [],
                      model.layer.weight.detach().clone())
    assert seen["fw"][:9] == seen["lightning"][:9]
    assert seen["fw"][9].equal(seen["lightning"][9])
    assert seen["fw"][:4] == (["EarlyStopping", "LearningRateMonitor", "ModelCheckpoint"], "", 0, ["DummyLogger"])
