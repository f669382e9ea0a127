"""``validate``/``test`` with ``verbose=True`` (the default, as in Lightning) show their results
as a table on stderr; ``verbose=False`` shows nothing. stdout stays the user's."""

from __future__ import annotations

import pytest
from torch.utils.data import DataLoader
from toy import QUIET, LinearModel, regression_data

import framework as fw


@pytest.mark.parametrize("stage", ["validate", "test"])
def test_verbose_shows_the_results_on_stderr_and_quiet_shows_none(stage, capsys, tmp_path):
    class Model(LinearModel):
        def test_step(self, batch, batch_idx):
            return self.validation_step(batch, batch_idx)

    data = DataLoader(regression_data(16), batch_size=8)
    trainer = fw.Trainer(**{**QUIET, "default_root_dir": str(tmp_path)})
    model = Model()
    capsys.readouterr()
    results = getattr(trainer, stage)(model, data)
    shown = capsys.readouterr()
    assert shown.out == ""
    assert f"{stage} results" in shown.err and "val/loss" in shown.err
    assert f"{results[0]['val/loss']:.6g}" in shown.err
    getattr(trainer, stage)(model, data, verbose=False)
    assert f"{stage} results" not in capsys.readouterr().err
