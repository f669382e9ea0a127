"""The progress bar: at 80 columns the count, times and it/s stay whole (the metrics are cut
first); everything goes to stderr, on a terminal or not; an evaluation's bar shows its own
stage's metrics only; validate and test end with a results table."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from toy import LinearModel, loader, regression_data

import framework as fw

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
ARGS = dict(logger=False, enable_checkpointing=False, accelerator="cpu", devices=1, enable_model_summary=False)


class LongNames(LinearModel):
    def training_step(self, batch, batch_idx):
        loss = F.mse_loss(self(batch[0]), batch[1])
        self.log("train/a_rather_long_loss_name", loss, prog_bar=True, on_step=True, on_epoch=True)
        self.log("train/another_long_metric_name", 2 * loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val/loss", F.mse_loss(self(batch[0]), batch[1]), prog_bar=True)

    def test_step(self, batch, batch_idx):
        self.log("test/loss", F.mse_loss(self(batch[0]), batch[1]), prog_bar=True)


def drawn_lines(text: str) -> list[str]:
    """The lines a terminal shows (control codes gone, each redraw a line of its own)."""
    return [line for line in re.split(r"[\r\n]", ANSI.sub("", text)) if line.strip()]


def test_at_80_columns_count_times_and_speed_stay_and_metrics_are_cut(monkeypatch, capsys):
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    monkeypatch.setenv("COLUMNS", "80")
    trainer = fw.Trainer(max_epochs=2, **ARGS)
    trainer.fit(LongNames(), loader(regression_data(n=64)), loader(regression_data(n=16, seed=1)))
    trainer.test(LongNames(), loader(regression_data(n=16, seed=2)))
    out, err = capsys.readouterr()
    assert out == ""  # stdout is the program's
    epoch = [line for line in drawn_lines(err) if line.startswith("Epoch 1/1")]
    assert epoch, err
    last = epoch[-1]
    assert len(last) <= 80, last
    assert re.search(r"8/8 \d:\d\d:\d\d < \d:\d\d:\d\d [\d.]+it/s +train/", last), last
    assert last.rstrip().endswith("…"), last  # the metrics did not fit: they, and only they, are cut
    testing = [line for line in drawn_lines(err) if line.startswith("Testing")][-1]
    assert " 2/2 " in testing and "test/loss=" in testing and "train/" not in testing and "val/" not in testing, testing
    assert ANSI.sub("", err).rindex("Testing") < ANSI.sub("", err).index("test results")  # the bar ends first


def test_not_on_a_terminal_the_lines_go_to_stderr_and_an_evaluation_shows_its_own_metrics(monkeypatch, capsys):
    monkeypatch.setenv("TTY_COMPATIBLE", "0")
    trainer = fw.Trainer(max_epochs=1, **ARGS)
    model = LongNames()
    trainer.fit(model, loader(regression_data(n=64)), loader(regression_data(n=16, seed=1)))
    results = trainer.test(model, loader(regression_data(n=16, seed=2)))
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert any(line.startswith("Epoch 0/0: 8 batches") and "train/a_rather_long_loss_name_step=" in line
               and "val/loss=" in line for line in lines), err
    testing = next(line for line in lines if line.startswith("Testing: 2 batches"))
    assert testing == f"Testing: 2 batches test/loss={results[0]['test/loss']:.4g}"  # not the fit's metrics
    assert "test results" in err and re.search(r"test/loss\s*│\s*" + f"{results[0]['test/loss']:.6g}", err), err


@pytest.mark.parametrize("fn", ["validate", "test"])
def test_validate_and_test_end_with_a_results_table_on_stderr(fn, monkeypatch, capsys):
    monkeypatch.setenv("TTY_COMPATIBLE", "0")
    model = LongNames()
    results = getattr(fw.Trainer(**ARGS, enable_progress_bar=False), fn)(model, loader(regression_data(n=16)))
    out, err = capsys.readouterr()
    name = "val/loss" if fn == "validate" else "test/loss"
    assert out == "" and f"{fn} results" in err
    row = next(line for line in err.splitlines() if name in line)
    assert f"{results[0][name]:.6g}" in row
    with torch.no_grad():
        x, y = regression_data(n=16).tensors
        assert results[0][name] == pytest.approx(float(F.mse_loss(model(x), y)), rel=1e-6)
