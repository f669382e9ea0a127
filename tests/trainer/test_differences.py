"""fw says once, at set-up, where it deliberately differs from Lightning and the run relies on
it (README, "Coming from Lightning"), and says nothing when the run does not."""

from __future__ import annotations

import logging

import pytest
import torch
from toy import QUIET, LinearModel, loader, regression_data

import framework as fw
from framework.callbacks import ModelCheckpoint
from framework.rank_zero import library_logger
from framework.trainer import differences


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setattr(differences, "_said", set())


class OwnLoaders(LinearModel):
    def train_dataloader(self):
        return loader(regression_data(16))

    def on_fit_start(self):
        pass


class Plateau(LinearModel):
    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.ReduceLROnPlateau(opt),
                                                   "monitor": "val/loss"}}


class Said(logging.Handler):
    """The 'differs from Lightning' lines fw's logger has emitted while installed."""

    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record):
        if "differs from Lightning" in record.getMessage():
            self.lines.append(record.getMessage())

    def __call__(self) -> list[str]:
        return self.lines


@pytest.fixture
def said():
    handler = Said()
    library_logger().addHandler(handler)
    yield handler
    library_logger().removeHandler(handler)


def test_each_difference_is_said_once_when_the_run_relies_on_it(tmp_path, said):
    data = loader(regression_data(16))
    for _ in range(2):  # once per process
        fw.Trainer(max_epochs=1, **QUIET).fit(OwnLoaders())
    assert len(said()) == 1 and "loaders are asked for once at set-up" in said()[0]

    trainer = fw.Trainer(max_epochs=1, default_root_dir=str(tmp_path), **{**QUIET, "enable_checkpointing": True})
    trainer.fit(Plateau(), data, data)
    assert "ReduceLROnPlateau steps before" in said()[-1]

    ckpt = str(tmp_path / "x.ckpt")
    trainer.save_checkpoint(ckpt)

    class Loading(Plateau):  # the same optimizer and scheduler as the checkpoint
        def on_load_checkpoint(self, checkpoint):
            pass

    fw.Trainer(max_epochs=2, **QUIET).fit(Loading(), data, data, ckpt_path=ckpt)
    assert "restored" in said()[-1] and len(said()) == 3


def test_last_checkpoint_difference_is_said_with_a_monitor_and_save_last(tmp_path, said):
    data = loader(regression_data(16))
    checkpoint = ModelCheckpoint(monitor="val/loss", save_last=True)
    fw.Trainer(max_epochs=1, default_root_dir=str(tmp_path), callbacks=[checkpoint],
               **{**QUIET, "enable_checkpointing": True}).fit(LinearModel(), data, data)
    assert len(said()) == 1 and "last.ckpt is written at every save point" in said()[0]


def test_fp16_autocast_on_the_cpu_is_said_and_bf16_is_not(said):
    data = loader(regression_data(16))
    for precision in ("16-mixed", "bf16-mixed"):
        fw.Trainer(max_epochs=1, precision=precision, **QUIET).fit(LinearModel(), data)
    assert len(said()) == 1 and "precision=16-mixed on the CPU runs float16 autocast" in said()[0]


def test_nothing_is_said_when_the_run_does_not_rely_on_a_difference(said, tmp_path):
    data = loader(regression_data(16))
    fw.Trainer(max_epochs=1, callbacks=[ModelCheckpoint()], **{**QUIET, "enable_checkpointing": True},
               default_root_dir=str(tmp_path)).fit(LinearModel(), data, data)
    assert said() == []


def test_the_one_order_is_said_for_a_shuffled_loader_in_one_process_unless_its_own_is_kept(said):
    shuffled = loader(regression_data(16), 8, shuffle=True)
    fw.Trainer(max_epochs=1, use_distributed_sampler=False, **QUIET).fit(LinearModel(), shuffled)
    assert said() == []  # the loader's own order, as Lightning's
    fw.Trainer(max_epochs=1, **QUIET).fit(LinearModel(), shuffled)
    assert len(said()) == 1 and "reads fw's one order for any number of ranks" in said()[0], said()
    assert "Trainer(use_distributed_sampler=False) keeps the loader's own order" in said()[0]


def test_fws_lines_go_to_stderr_as_it_is_now_not_as_it_was_at_the_first_line(capfd):
    """A first line logged inside redirect_stderr (a notebook cell's capture, a test's) does not
    take the later lines with it."""
    import contextlib
    import io

    from framework.rank_zero import rank_zero_info

    with contextlib.redirect_stderr(io.StringIO()) as captured:
        rank_zero_info("fw: inside the redirect")
    rank_zero_info("fw: after it")
    assert "inside the redirect" in captured.getvalue() and "after it" not in captured.getvalue()
    assert "fw: after it" in capfd.readouterr().err


def test_a_level_set_before_fws_first_line_is_kept(capfd, monkeypatch):
    """``logging.getLogger("framework").setLevel(logging.WARNING)`` before fw's first line
    silences its notes (fw's set-up of its logger keeps a level a program chose)."""
    from framework.rank_zero import rank_zero_info

    log = logging.getLogger("framework")
    monkeypatch.setattr(log, "handlers", [])
    monkeypatch.delattr(log, "_fw_configured", raising=False)
    level = log.level
    log.setLevel(logging.WARNING)
    try:
        rank_zero_info("fw: a note")
        assert "a note" not in capfd.readouterr().err
        assert log.level == logging.WARNING
    finally:
        log.setLevel(level)
