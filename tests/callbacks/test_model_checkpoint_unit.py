"""ModelCheckpoint against a fake Trainer, checked against the real one (last test)."""

import os

import pytest
import torch

from framework.callbacks import ModelCheckpoint
from framework.errors import ConfigError

from .fakes import assert_matches_real, real_trainer


class FakeStrategy:
    TEST_ONLY = ("decisions",)
    is_global_zero = True
    is_distributed = False

    def __init__(self):
        self.decisions = []

    def broadcast(self, obj, src=0):
        return obj

    def barrier(self, name=None):
        pass

    def reduce_boolean_decision(self, decision, all=True):
        self.decisions.append(decision)
        return bool(decision)


class FakeLogger:
    def after_save_checkpoint(self, callback) -> None:
        pass


class FakeTrainer:
    TEST_ONLY = ("saved",)

    def __init__(self, root, log_dir=None):
        self.current_epoch = 0
        self.global_step = 0
        self.sanity_checking = False
        self.fast_dev_run = 0
        self.callback_metrics = {}
        self.is_global_zero = True
        self.strategy = FakeStrategy()
        self.log_dir = log_dir
        self.default_root_dir = str(root)
        self.check_val_every_n_epoch = 1  # with no validation data: epoch saves at the train epoch's end
        self.val_check_interval = None
        self.val_dataloaders = None
        # told of each save (after_save_checkpoint); a log_dir is a logger's version folder, so there is one
        self.loggers = [FakeLogger()] if log_dir else []
        self.saved = []

    def save_checkpoint(self, filepath, weights_only=False, storage_options=None):
        os.makedirs(os.path.dirname(filepath), exist_ok=True)
        with open(filepath, "w") as f:
            f.write("ckpt")
        self.saved.append(filepath)


def fit_epochs(cb, trainer, values, key="val/loss", steps_per_epoch=10):
    """Run epochs: setup, then per epoch validation end + train epoch end with ``key`` = value."""
    cb.setup(trainer, None, "fit")
    for epoch, value in enumerate(values):
        trainer.current_epoch = epoch
        trainer.global_step = (epoch + 1) * steps_per_epoch
        trainer.callback_metrics = {key: torch.tensor(value), "train/loss": torch.tensor(1.0)}
        cb.on_validation_end(trainer, None)
        cb.on_train_epoch_end(trainer, None)


def files(dirpath):
    return sorted(os.listdir(dirpath))


@pytest.mark.parametrize(("args", "metrics", "ver", "expected"), [
    (dict(filename="{epoch}-{val/acc:.3f}"), {"epoch": 3, "val/acc": 0.95123}, None, "epoch=3-val/acc=0.951.ckpt"),
    ({}, {"epoch": 3, "step": 120}, None, "epoch=3-step=120.ckpt"),
    ({}, {"epoch": 3, "step": 120}, 2, "epoch=3-step=120-v2.ckpt"),
    (dict(filename="best-{epoch:02d}-{val/acc:.2f}", auto_insert_metric_name=False), {"epoch": 3, "val/acc": 0.5},
     None, "best-03-0.50.ckpt"),
    # keys that prefix each other, dots, and a missing key (formats as 0)
    (dict(filename="{val/acc}-{val/acc_top5:.1f}-{a.b}-{missing}"), {"val/acc": 0.5, "val/acc_top5": 0.75, "a.b": 2},
     None, "val/acc=0.5-val/acc_top5=0.8-a.b=2-missing=0.ckpt"),
])
def test_format_checkpoint_name_is_lightnings(args, metrics, ver, expected):
    assert ModelCheckpoint(dirpath="/ck", **args).format_checkpoint_name(metrics, ver=ver) == "/ck/" + expected
    pl = pytest.importorskip("pytorch_lightning")
    tensors = {k: torch.tensor(v) for k, v in metrics.items()}
    assert pl.callbacks.ModelCheckpoint(dirpath="/ck", **args).format_checkpoint_name(tensors, ver=ver) == "/ck/" + expected


def test_default_dirpath_from_log_dir_or_root(tmp_path):
    cb = ModelCheckpoint()
    cb.setup(FakeTrainer(tmp_path, log_dir=str(tmp_path / "logs" / "version_0")), None, "fit")
    assert cb.dirpath == os.path.realpath(tmp_path / "logs" / "version_0" / "checkpoints")
    cb = ModelCheckpoint()
    cb.setup(FakeTrainer(tmp_path), None, "fit")
    assert cb.dirpath == os.path.realpath(tmp_path / "checkpoints")


def test_top_k_min(tmp_path):
    trainer = FakeTrainer(tmp_path)
    cb = ModelCheckpoint(monitor="val/loss", mode="min", save_top_k=2, filename="{epoch}")
    fit_epochs(cb, trainer, [0.9, 0.5, 0.7, 0.4, 0.8])
    d = cb.dirpath
    assert files(d) == ["epoch=1.ckpt", "epoch=3.ckpt"]
    assert cb.best_model_path == os.path.join(d, "epoch=3.ckpt")
    assert cb.best_model_score == pytest.approx(0.4)
    assert cb.kth_best_model_path == os.path.join(d, "epoch=1.ckpt")
    assert cb.kth_value == pytest.approx(0.5)
    assert set(cb.best_k_models) == {os.path.join(d, "epoch=1.ckpt"), os.path.join(d, "epoch=3.ckpt")}
    # epochs 0, 1, 2 (enters while 0.9 is kth), 3 saved; 4 (0.8) not better than kth 0.5
    assert [os.path.basename(p) for p in trainer.saved] == ["epoch=0.ckpt", "epoch=1.ckpt", "epoch=2.ckpt", "epoch=3.ckpt"]
    assert trainer.strategy.decisions == [True, True, True, True, False]


def test_top_k_max_with_last(tmp_path):
    trainer = FakeTrainer(tmp_path)
    cb = ModelCheckpoint(monitor="val/acc", mode="max", save_top_k=1, save_last=True)
    fit_epochs(cb, trainer, [0.5, 0.7, 0.6], key="val/acc")
    assert files(cb.dirpath) == ["epoch=1-step=20.ckpt", "last.ckpt"]
    assert cb.best_model_score == pytest.approx(0.7)
    assert cb.last_model_path == os.path.join(cb.dirpath, "last.ckpt")


def test_save_top_k_all_and_none(tmp_path):
    cb = ModelCheckpoint(dirpath=tmp_path / "all", monitor="val/loss", save_top_k=-1)
    fit_epochs(cb, FakeTrainer(tmp_path), [3.0, 2.0, 4.0])
    assert len(files(cb.dirpath)) == 3
    assert cb.best_model_score == pytest.approx(2.0)
    cb = ModelCheckpoint(dirpath=tmp_path / "none", monitor="val/loss", save_top_k=0)
    fit_epochs(cb, FakeTrainer(tmp_path), [3.0, 2.0])
    assert not os.path.exists(cb.dirpath)


def test_no_monitor_keeps_latest(tmp_path):
    cb = ModelCheckpoint(dirpath=tmp_path / "ck")
    fit_epochs(cb, FakeTrainer(tmp_path), [1.0, 1.0, 1.0])
    assert files(cb.dirpath) == ["epoch=2-step=30.ckpt"]
    assert cb.best_model_path.endswith("epoch=2-step=30.ckpt")


def test_nan_is_never_best(tmp_path):
    cb = ModelCheckpoint(dirpath=tmp_path / "ck", monitor="val/loss", save_top_k=1, filename="{epoch}")
    fit_epochs(cb, FakeTrainer(tmp_path), [float("nan"), 0.5, float("nan")])
    assert files(cb.dirpath) == ["epoch=1.ckpt"]
    assert cb.best_model_score == pytest.approx(0.5)


def test_version_suffix_on_clash(tmp_path):
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "epoch=0.ckpt").write_text("old run")
    cb = ModelCheckpoint(dirpath=tmp_path / "ck", monitor="val/loss", save_top_k=-1, filename="{epoch}")
    fit_epochs(cb, FakeTrainer(tmp_path), [1.0])
    assert files(cb.dirpath) == ["epoch=0-v1.ckpt", "epoch=0.ckpt"]
    assert (tmp_path / "ck" / "epoch=0.ckpt").read_text() == "old run"
    assert cb.best_model_path.endswith("epoch=0-v1.ckpt")


def test_every_n_train_steps_and_accumulation(tmp_path):
    trainer = FakeTrainer(tmp_path)
    cb = ModelCheckpoint(dirpath=tmp_path / "ck", every_n_train_steps=2, save_top_k=-1, filename="{step}")
    cb.setup(trainer, None, "fit")
    for batch_idx, step in enumerate([0, 1, 1, 2, 2, 3, 4]):  # two batches share a step
        trainer.global_step = step
        cb.on_train_batch_end(trainer, None, None, None, batch_idx)
    cb.on_train_epoch_end(trainer, None)  # every_n_epochs is off when every_n_train_steps is set
    assert files(cb.dirpath) == ["step=2.ckpt", "step=4.ckpt"]
    assert len(trainer.saved) == 2


def test_every_n_epochs(tmp_path):
    cb = ModelCheckpoint(dirpath=tmp_path / "ck", every_n_epochs=2, save_top_k=-1, filename="{epoch}")
    fit_epochs(cb, FakeTrainer(tmp_path), [1.0] * 5)
    assert files(cb.dirpath) == ["epoch=1.ckpt", "epoch=3.ckpt"]


def test_never_saves_during_sanity_check_or_outside_fit(tmp_path):
    trainer = FakeTrainer(tmp_path)
    cb = ModelCheckpoint(dirpath=tmp_path / "ck", monitor="val/loss", save_on_train_epoch_end=False)
    cb.setup(trainer, None, "fit")
    trainer.sanity_checking, trainer.global_step = True, 5
    trainer.callback_metrics = {"val/loss": torch.tensor(1.0)}
    cb.on_validation_end(trainer, None)
    assert trainer.saved == []
    trainer.sanity_checking = False
    cb.setup(trainer, None, "validate")
    cb.on_validation_end(trainer, None)
    assert trainer.saved == []
    cb.setup(trainer, None, "fit")
    cb.on_validation_end(trainer, None)  # save_on_train_epoch_end=False: saves here
    assert len(trainer.saved) == 1


def test_missing_monitor_raises_once_validation_ran(tmp_path):
    trainer = FakeTrainer(tmp_path)
    cb = ModelCheckpoint(dirpath=tmp_path / "ck", monitor="val/los")
    cb.setup(trainer, None, "fit")
    trainer.global_step = 10
    trainer.callback_metrics = {"train/loss": torch.tensor(1.0)}
    with pytest.warns(UserWarning, match="val/los"):
        cb.on_train_epoch_end(trainer, None)  # no validation yet: warn, don't save top-k
    trainer.global_step = 20
    trainer.callback_metrics = {"val/loss": torch.tensor(1.0), "train/loss": torch.tensor(1.0)}
    cb.on_validation_end(trainer, None)
    with pytest.raises(ConfigError) as info:
        cb.on_train_epoch_end(trainer, None)
    message = str(info.value)
    assert "'val/los'" in message and "did you mean 'val/loss'" in message and "train/loss" in message


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"mode": "maximum"}, "did you mean 'max'"),
    ({"save_top_k": -2}, "save_top_k"),
    ({"save_top_k": 3}, "needs a monitor"),
    ({"every_n_train_steps": -1}, "every_n_train_steps"),
])
def test_invalid_arguments(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        ModelCheckpoint(**kwargs)


def test_state_dict_round_trip_continues_bookkeeping(tmp_path):
    trainer = FakeTrainer(tmp_path, log_dir=str(tmp_path / "v0"))
    cb = ModelCheckpoint(monitor="val/loss", save_top_k=2, save_last=True, filename="{epoch}")
    fit_epochs(cb, trainer, [0.9, 0.5, 0.7])
    state = cb.state_dict()

    # A resumed run logs into a new version folder but keeps pruning the old checkpoints.
    resumed = ModelCheckpoint(monitor="val/loss", save_top_k=2, save_last=True, filename="{epoch}")
    resumed.setup(FakeTrainer(tmp_path, log_dir=str(tmp_path / "v1")), None, "fit")
    resumed.load_state_dict(state)
    assert resumed.dirpath == cb.dirpath
    assert resumed.best_k_models == cb.best_k_models and resumed.kth_value == cb.kth_value
    trainer2 = FakeTrainer(tmp_path, log_dir=str(tmp_path / "v1"))
    trainer2.current_epoch, trainer2.global_step = 3, 40
    trainer2.callback_metrics = {"val/loss": torch.tensor(0.6)}
    resumed.on_train_epoch_end(trainer2, None)
    assert files(cb.dirpath) == ["epoch=1.ckpt", "epoch=3.ckpt", "last.ckpt"]
    assert resumed.best_model_path.endswith("epoch=1.ckpt")

    # Another monitor: only best_model_path comes back.
    other = ModelCheckpoint(monitor="val/acc", mode="max")
    with pytest.warns(UserWarning, match="Only best_model_path"):
        other.load_state_dict(state)
    assert other.best_model_path == cb.best_model_path and other.best_k_models == {}


def test_state_keys_differ_between_instances():
    assert ModelCheckpoint(monitor="a").state_key != ModelCheckpoint(monitor="b").state_key


def test_the_fakes_have_the_real_interface():
    real = real_trainer()
    assert_matches_real(FakeTrainer("/tmp"), real)
    assert_matches_real(FakeStrategy(), real.strategy)
