"""The Trainer keeps its settings and its parts; a call's state lives in its ``Run``.

- No attribute of the Trainer appears after ``__init__`` (a fit, validate, test, predict leave
  the same set of attributes), and the settings cannot be changed.
- No module outside ``framework/trainer/`` assigns an attribute of a Trainer; the one exception
  is Lightning's public ``trainer.should_stop = True`` (a property that sets the run's state).
"""

from __future__ import annotations

import dataclasses
import io
import tokenize
from pathlib import Path

import pytest
from torch.utils.data import DataLoader
from toy import QUIET, LinearModel, regression_data

import framework as fw

FRAMEWORK = Path(__file__).resolve().parents[2] / "framework"


def _trainer_assignments(source: str) -> list[tuple[int, str]]:
    """``(line, name)`` of each ``trainer.<name> = ...`` in the code (strings and comments aside)."""
    tokens = [t for t in tokenize.generate_tokens(io.StringIO(source).readline)
              if t.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE)]
    return [(tokens[i].start[0], tokens[i + 2].string) for i in range(len(tokens) - 3)
            if tokens[i].string == "trainer" and tokens[i + 1].string == "." and tokens[i + 3].string == "="
            and (i == 0 or tokens[i - 1].string != ".")]


def test_a_call_adds_no_attribute_to_the_trainer_and_the_next_one_starts_fresh(tmp_path):
    trainer = fw.Trainer(**{**QUIET, "max_epochs": 1, "default_root_dir": str(tmp_path)})
    before = set(vars(trainer))
    model, data = LinearModel(), DataLoader(regression_data(16), batch_size=4)
    trainer.fit(model, data, data)
    first = trainer.run
    trainer.validate(model, data)
    trainer.test(model, data)
    trainer.predict(model, data)
    assert set(vars(trainer)) == before
    assert trainer.run is not first and trainer.run.fn == "predict"  # each call its own Run
    assert trainer.lightning_module is model
    assert trainer.optimizers == first.optimizers != [] and trainer.last_fit is first  # the fit's, as in Lightning


def test_the_settings_are_frozen():
    trainer = fw.Trainer(**{**QUIET, "max_epochs": 3})
    assert trainer.max_epochs == 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        trainer.settings.max_epochs = 5
    with pytest.raises(AttributeError):
        trainer.max_epochs = 5


def test_no_module_outside_the_trainer_package_assigns_trainer_attributes():
    found = []
    for path in FRAMEWORK.rglob("*.py"):
        if path.parent.name == "trainer":
            continue
        for number, name in _trainer_assignments(path.read_text()):
            if name != "should_stop":
                found.append(f"{path.relative_to(FRAMEWORK)}:{number}: trainer.{name} = ...")
    assert not found, "\n".join(found)
