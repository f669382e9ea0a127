"""Differences a side-by-side sweep found (fw against pytorch_lightning on the same module), each
now Lightning's: LBFGS's closure zeroes the gradients at each of its calls; a bare
ReduceLROnPlateau takes the dict's top-level ``monitor`` (and one without any monitor is
refused); EarlyStopping keeps a negative ``min_delta``'s sign; ``load_from_checkpoint`` reads
``hparams_file``."""

from __future__ import annotations

import os

import pytest
import torch
import yaml
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import framework as fw
import framework.callbacks as fw_callbacks
from framework.errors import ConfigError

pl = pytest.importorskip("pytorch_lightning")
QUIET = dict(accelerator="cpu", devices=1, enable_progress_bar=False, enable_model_summary=False, logger=False,
             enable_checkpointing=False, num_sanity_val_steps=0)


def _loader(n: int = 32, seed: int = 0) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True) + 0.1 * torch.randn(n, 1, generator=g)), batch_size=4)


def _sides() -> list[tuple]:
    return [(fw, fw.TrainModule, fw_callbacks), (pl, pl.LightningModule, pl.callbacks)]


def _model(base: type, optimizers=None, on_validation_epoch_end=None, lr: float = 0.1):
    class Model(base):
        def __init__(self, lr: float = lr, width: int = 2) -> None:
            super().__init__()
            self.save_hyperparameters()
            torch.manual_seed(0)
            self.layer = nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            return nn.functional.mse_loss(self.layer(batch[0]), batch[1])

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", nn.functional.mse_loss(self.layer(batch[0]), batch[1]))

        def on_validation_epoch_end(self):
            if on_validation_epoch_end is not None:
                on_validation_epoch_end(self)

        def on_train_epoch_start(self):
            self.log("worse", float(self.current_epoch))  # grows: a plateau in mode "min"

        def configure_optimizers(self):
            if optimizers is not None:
                return optimizers(self)
            return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    return Model()


def _weights(module) -> list[float]:
    return module.layer.weight.detach().flatten().tolist()


@pytest.mark.timeout(60)
def test_lbfgs_and_a_plateau_monitored_at_the_top_level_train_as_in_lightning():
    def lbfgs(module):
        return torch.optim.LBFGS(module.parameters(), lr=0.1, max_iter=5)

    def plateau(module):
        opt = torch.optim.SGD(module.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0, factor=0.5)
        return {"optimizer": opt, "lr_scheduler": scheduler, "monitor": "worse"}

    for optimizers in (lbfgs, plateau):
        results = []
        for lib, base, _ in _sides():
            model = _model(base, optimizers)
            trainer = lib.Trainer(max_epochs=3, limit_val_batches=0, **QUIET)
            trainer.fit(model, _loader())
            results.append([*_weights(model), trainer.optimizers[0].param_groups[0]["lr"]])
        assert results[0] == pytest.approx(results[1], rel=1e-6), optimizers.__name__
    assert results[0][-1] == 0.1 * 0.5 ** 2  # the plateau stepped on "worse", twice


def test_a_plateau_without_a_monitor_is_refused_as_in_lightning():
    def bare(module):
        opt = torch.optim.SGD(module.parameters(), lr=0.1)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.ReduceLROnPlateau(opt)}

    with pytest.raises(ConfigError, match="a ReduceLROnPlateau needs the metric it watches"):
        fw.Trainer(max_epochs=1, **QUIET).fit(_model(fw.TrainModule, bare), _loader())
    with pytest.raises(Exception, match="must include a monitor when a `ReduceLROnPlateau`"):
        pl.Trainer(max_epochs=1, **QUIET).fit(_model(pl.LightningModule, bare), _loader())


@pytest.mark.timeout(60)
def test_a_negative_min_delta_counts_a_slight_worsening_as_in_lightning():
    stops = []
    for lib, base, callbacks in _sides():
        stopping = callbacks.EarlyStopping(monitor="score", mode="min", min_delta=-0.1, patience=1)

        def log_score(module):
            module.log("score", [3.0, 3.05, 3.1, 3.3, 3.4, 3.5][module.current_epoch])

        lib.Trainer(max_epochs=6, callbacks=[stopping], **QUIET).fit(_model(base, None, log_score), _loader(),
                                                                      _loader(16, seed=1))
        stops.append((stopping.stopped_epoch, float(stopping.best_score)))
    assert stops[0] == stops[1] == (3, pytest.approx(3.1))


def test_load_from_checkpoint_reads_hparams_file(tmp_path):
    (tmp_path / "hparams.yaml").write_text(yaml.safe_dump({"lr": 0.7, "width": 3}))
    loaded = []
    for lib, base, _ in _sides():
        trainer = lib.Trainer(max_epochs=1, limit_val_batches=0, default_root_dir=str(tmp_path), **QUIET)
        model = _model(base)
        trainer.fit(model, _loader())
        path = tmp_path / f"{lib.__name__}.ckpt"
        trainer.save_checkpoint(path)
        again = type(model).load_from_checkpoint(path, hparams_file=tmp_path / "hparams.yaml", width=4)
        loaded.append(dict(again.hparams))
    assert loaded[0] == loaded[1] == {"lr": 0.7, "width": 4}  # the file's, then the keyword's


def _logger_events(lib, base) -> list[str]:
    import framework.loggers as fw_loggers

    class Recorder(fw_loggers.Logger if lib is fw else pl.loggers.Logger):
        name, version = "rec", 0

        def __init__(self) -> None:
            super().__init__(*([""] if lib is fw else []))
            self.events: list[str] = []

        def log_metrics(self, metrics, step=None):
            self.events.append("log")

        def log_hyperparams(self, *args, **kwargs):
            pass

        def save(self):
            self.events.append("save")

    class Logs(type(_model(base))):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            self.log("loss", loss)
            return loss

    logger = Recorder()
    settings = {**QUIET, "logger": logger, "log_every_n_steps": 1}
    lib.Trainer(max_epochs=1, limit_val_batches=0, **settings).fit(Logs(), _loader())
    return logger.events


def test_a_logger_is_asked_to_save_after_every_row_as_in_lightning():
    ours, theirs = _logger_events(fw, fw.TrainModule), _logger_events(pl, pl.LightningModule)
    for events in (ours, theirs):
        rows = [i for i, event in enumerate(events) if event == "log"]
        assert len(rows) == 9 and all(events[i + 1] == "save" for i in rows)  # a buffering logger writes as it goes


def _monitored_mid_epoch(lib, base, callbacks, root) -> tuple[list, list]:
    seen = []

    class Logs(type(_model(base))):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            self.log("loss", loss, on_step=True, on_epoch=True)
            return loss

    class Spy(lib.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            value = trainer.callback_metrics.get("loss")
            seen.append(None if value is None else round(float(value), 5))

    checkpoint = callbacks.ModelCheckpoint(dirpath=str(root), monitor="loss", every_n_train_steps=2, save_top_k=2,
                                           filename="{step}")
    settings = {**QUIET, "enable_checkpointing": True}
    lib.Trainer(max_epochs=2, limit_val_batches=0, callbacks=[Spy(), checkpoint], **settings).fit(
        Logs(), _loader(24))
    best = sorted((os.path.basename(path), round(float(score), 5)) for path, score in checkpoint.best_k_models.items())
    return seen, best


def test_a_step_and_epoch_value_is_its_latest_step_during_the_epoch_as_in_lightning(tmp_path):
    """``callback_metrics["loss"]`` of ``self.log("loss", on_step=True, on_epoch=True)`` is the
    latest step's during the epoch (fw had none in the first epoch, then the last epoch's mean),
    so a ModelCheckpoint every 2 steps keeps Lightning's checkpoints."""
    ours = _monitored_mid_epoch(fw, fw.TrainModule, fw_callbacks, tmp_path / "fw")
    theirs = _monitored_mid_epoch(pl, pl.LightningModule, pl.callbacks, tmp_path / "pl")
    assert ours == theirs
    assert None not in ours[0] and len(set(ours[0])) == len(ours[0])  # a new value every step


def test_a_datamodule_reads_hparams_file_too(tmp_path):
    (tmp_path / "hparams.yaml").write_text(yaml.safe_dump({"batch_size": 8}))
    sizes = []
    for lib, base, _ in _sides():
        class Data(lib.LightningDataModule if lib is pl else lib.DataModule):
            def __init__(self, batch_size: int = 4) -> None:
                super().__init__()
                self.save_hyperparameters()

            def train_dataloader(self):
                return _loader()

        trainer = lib.Trainer(max_epochs=1, limit_val_batches=0, default_root_dir=str(tmp_path), **QUIET)
        trainer.fit(_model(base), datamodule=Data())
        path = tmp_path / f"{lib.__name__}-data.ckpt"
        trainer.save_checkpoint(path)
        sizes.append(Data.load_from_checkpoint(path, hparams_file=tmp_path / "hparams.yaml").hparams.batch_size)
    assert sizes == [8, 8]


def test_what_lightning_refuses_fw_refuses_too(tmp_path):
    """``load_from_checkpoint`` called on an instance (it returns a new module and leaves the
    instance as it was: a silent no-op where the return value is dropped) and a fraction of an
    epoch as ``val_check_interval`` with ``check_val_every_n_epoch=None`` are refused, as Lightning
    refuses them."""
    from framework.data import DataModule

    for _, base, _ in _sides():
        model = _model(base)
        with pytest.raises(TypeError, match="cannot be called on an instance"):
            model.load_from_checkpoint(str(tmp_path / "x.ckpt"))
    for datamodule in (DataModule(), pl.LightningDataModule()):
        with pytest.raises(TypeError, match="cannot be called on an instance"):
            datamodule.load_from_checkpoint(str(tmp_path / "x.ckpt"))
    with pytest.raises(ConfigError, match=r"val_check_interval=0.5.*check_val_every_n_epoch=None"):
        fw.Trainer(val_check_interval=0.5, check_val_every_n_epoch=None)
    with pytest.raises(Exception, match="val_check_interval"):
        pl.Trainer(val_check_interval=0.5, check_val_every_n_epoch=None)


@pytest.mark.timeout(60)
def test_self_log_after_a_fit_is_refused_as_in_lightning():
    """Between calls nothing reads a logged value: both refuse it rather than drop it."""
    for lib, base, _ in _sides():
        model = _model(base)
        lib.Trainer(max_epochs=1, **QUIET).fit(model, _loader())
        with pytest.raises(Exception, match=r"self.log"):
            model.log("after", 1.0)
