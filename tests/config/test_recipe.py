"""Recipes: merging, overrides, instantiation, and a one-line error for every mistake."""

from __future__ import annotations

from pathlib import Path

import pytest

from framework.config import instantiate, load_recipe
from framework.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "conf" / "digits.yaml"


def write(tmp_path, text: str) -> Path:
    path = tmp_path / "r.yaml"
    path.write_text(text)
    return path


def test_overrides_merge_in_order_and_types_are_kept():
    recipe, text = load_recipe(DIGITS, ["trainer.max_epochs=3", "data.batch_size=16", "trainer.devices=[0, 1]",
                                        "trainer.strategy=ddp_gloo", "trainer.strategy.timeout=60",
                                        "module.new_arg=1.5"])
    assert recipe["trainer"]["max_epochs"] == 3
    assert recipe["data"]["batch_size"] == 16
    assert recipe["trainer"]["devices"] == [0, 1]
    assert recipe["trainer"]["strategy"] == {"name": "ddp_gloo", "timeout": 60}
    assert recipe["module"]["new_arg"] == 1.5
    assert "max_epochs: 3" in text
    assert recipe["trainer"]["log_every_n_steps"] == 10  # from the file
    assert recipe["trainer"]["num_sanity_val_steps"] == 2  # schema default


@pytest.mark.parametrize("content,overrides,pattern", [
    (None, [], "does not exist"),
    ("module: [1, 2\n", [], "not valid YAML at line 2"),
    ("", [], "is empty"),
    ("- a\n- b\n", [], "must be a mapping"),
    ("modul:\n  _target_: x\n", [], r"unknown key 'modul' \(did you mean 'module'\?\)"),
    ("module:\n  _target_: toy.LinearModel\ntrainer:\n  max_epoch: 3\n", [],
     r"unknown key 'trainer.max_epoch' \(did you mean 'max_epochs'\?\)"),
    ("module:\n  _target_: toy.LinearModel\n", ["trainer.max_epochs=abc"], "trainer.max_epochs: expected an integer"),
    ("module:\n  _target_: toy.LinearModel\n", ["trainer.gradient_clip_vall=1"], "did you mean 'gradient_clip_val'"),
    ("module:\n  _target_: toy.LinearModel\n", ["trainer.max_epochs"], "has no '='"),
    ("data:\n  _target_: toy.ToyData\n", [], "no 'module' section"),
    ("module:\n  lr: 1\n", [], "needs '_target_"),
])
def test_recipe_mistakes_are_config_errors(tmp_path, content, overrides, pattern):
    path = tmp_path / "missing.yaml" if content is None else write(tmp_path, content)
    with pytest.raises(ConfigError, match=pattern):
        load_recipe(path, overrides)


@pytest.mark.parametrize("node,pattern", [
    ({"_target_": "toy.LinearModl"}, r"'toy' has no 'LinearModl' \(did you mean 'LinearModel'\?\)"),
    ({"_target_": "nosuchpkg.Model"}, "cannot import 'nosuchpkg.Model'"),
    ({"_target_": "toy.LinearModel", "lrr": 0.1}, r"unknown argument 'lrr' \(did you mean 'lr'\?\)"),
    ({"_target_": "toy"}, "not a class or function"),
])
def test_instantiate_errors_name_the_key(node, pattern):
    with pytest.raises(ConfigError, match="module"):
        instantiate(node, "module")
    with pytest.raises(ConfigError, match=pattern):
        instantiate(node, "module")


def test_instantiate_builds_nested_targets():
    obj = instantiate({"_target_": "framework.callbacks.EarlyStopping", "monitor": "val/loss", "patience": 2},
                      "callbacks[0]")
    assert type(obj).__name__ == "EarlyStopping" and obj.patience == 2
