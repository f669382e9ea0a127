"""Recipes: merging, overrides, instantiation, and a one-line error for every mistake."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

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


@pytest.mark.parametrize(("content", "overrides", "pattern"), [
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


@pytest.mark.parametrize(("node", "pattern"), [
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


def test_override_values_read_as_the_recipe_file_reads_them():
    recipe, _ = load_recipe(DIGITS, ["module.lr=1e-3", "module.hidden=64", "data.batch_size=0x10"])
    assert recipe["module"]["lr"] == 0.001 and isinstance(recipe["module"]["lr"], float)  # YAML 1.1 alone: '1e-3'
    module = instantiate(recipe["module"], "module")
    assert module.hparams.lr == 0.001 and module.hparams.hidden == 64
    assert recipe["data"]["batch_size"] == 16


def test_remove_and_append_overrides(tmp_path):
    recipe, text = load_recipe(DIGITS, [
        "module.dropout=0.5", "~module.dropout", "~trainer.log_every_n_steps",
        "+callbacks={_target_: framework.callbacks.EarlyStopping, monitor: val/loss}",
        "~callbacks.1",  # the LearningRateMonitor: the EarlyStopping appended above is now third, then second
        "+module.weight_decay=0.01",
    ])
    assert "dropout" not in recipe["module"] and recipe["module"]["weight_decay"] == 0.01
    assert recipe["trainer"]["log_every_n_steps"] == 50  # the Trainer's default, not the file's 10
    assert [c["_target_"].rsplit(".", 1)[1] for c in recipe["callbacks"]] == ["ModelCheckpoint", "EarlyStopping"]
    assert "dropout" not in text
    module = instantiate(recipe["module"], "module")
    assert module.hparams.dropout == 0.1  # DigitsClassifier's default in the code, not the 0.5 set and removed
    empty = write(tmp_path, "module:\n  _target_: toy.LinearModel\n")
    recipe, _ = load_recipe(empty, ["+callbacks=[{_target_: framework.callbacks.EarlyStopping, monitor: a}, "
                                    "{_target_: framework.callbacks.EarlyStopping, monitor: b}]"])
    assert [c["monitor"] for c in recipe["callbacks"]] == ["a", "b"]


@pytest.mark.parametrize(("overrides", "message"), [
    (["~module.nothere"], "~module.nothere: the recipe has no key 'module.nothere' to remove"),
    (["~trainer.max_epochs=3"], "override '~trainer.max_epochs=3': write ~trainer.max_epochs to remove a key (no value)"),
    (["+module.lr=3"], "+module.lr: 'module.lr' is already set and is not a list; write module.lr=... to replace it"),
    (["trainer.max_epochs"], "override 'trainer.max_epochs' has no '='; write key=value (e.g. trainer.max_epochs=5), "
                             "~key to remove a key or +key=value to append to a list"),
])
def test_override_mistakes_exact_messages(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_recipe(DIGITS, overrides)
    assert str(err.value) == message


@pytest.mark.parametrize(("override", "message"), [
    ("module.lr=abc", "module.lr: expected a number (float), got 'abc'; fix the value in the recipe or the override"),
    ("module.hidden=1.5", "module.hidden: expected an integer (int), got 1.5; fix the value in the recipe or the override"),
    ("module.hidden=true", "module.hidden: expected an integer (int), got True; fix the value in the recipe or the override"),
])
def test_module_arguments_are_checked_against_their_annotations(override, message):
    recipe, _ = load_recipe(DIGITS, [override])
    with pytest.raises(ConfigError) as err:
        instantiate(recipe["module"], "module")
    assert str(err.value) == message


class Typed:
    def __init__(self, widths: tuple[int, ...] = (1,), rate: float = 0.1, name: str = "x",
                 mode: Literal["a", "b"] = "a", where: Path | None = None, extra: dict[str, int] | None = None,
                 pair: tuple[int, str] = (0, ""), either: int | str = 0, **kwargs) -> None:
        self.__dict__.update(widths=widths, rate=rate, name=name, mode=mode, where=where, extra=extra,
                             pair=pair, either=either, kwargs=kwargs)


def test_values_converted_where_nothing_is_lost():
    obj = instantiate({"_target_": f"{__name__}.Typed", "widths": [8, 16], "rate": 1, "name": 123, "mode": "b",
                       "where": "runs/x", "extra": {"a": 1}, "pair": [2, "y"], "either": "3", "free": "kept"}, "module")
    assert obj.widths == (8, 16) and obj.rate == 1.0 and isinstance(obj.rate, float) and obj.name == "123"
    assert obj.mode == "b" and obj.where == Path("runs/x") and obj.extra == {"a": 1} and obj.pair == (2, "y")
    assert obj.either == "3" and obj.kwargs == {"free": "kept"}  # int | str keeps the string; **kwargs unchecked
    for key, value, expected in [("widths", [1, "a"], "an integer"), ("mode", "c", "one of 'a', 'b'"),
                                 ("pair", [1], "a list of 2 items"), ("extra", [1], "a mapping"),
                                 ("where", 3, "a path or null")]:
        with pytest.raises(ConfigError, match=rf"^module\.{key}: expected {expected}"):
            instantiate({"_target_": f"{__name__}.Typed", key: value}, "module")


def test_a_class_without_arguments_says_so():
    with pytest.raises(ConfigError) as err:
        instantiate({"_target_": "framework.callbacks.Callback", "channels": 3}, "callbacks[0]")
    assert str(err.value) == "callbacks[0]: unknown argument 'channels'; accepted: none (it takes no arguments)"


def test_the_digits_are_scikit_learns_read_from_its_file(monkeypatch):
    """The digits recipe reads scikit-learn's bundled file itself (importing scikit-learn costs
    0.7 s of CPU in every process that trains on them) and gets load_digits' arrays exactly;
    without that file it asks load_digits."""
    import numpy as np
    import sklearn.datasets

    from recipes import digits

    expected_x, expected_y = sklearn.datasets.load_digits(return_X_y=True)

    def refuse(**kwargs):
        raise AssertionError("load_digits was called although its file is there")

    with monkeypatch.context() as patched:
        patched.setattr(sklearn.datasets, "load_digits", refuse)
        x, y = digits.load_digits()
    assert x.dtype == expected_x.dtype and y.dtype == expected_y.dtype
    assert np.array_equal(x, expected_x) and np.array_equal(y, expected_y)

    monkeypatch.setattr(digits, "bundled_digits_file", lambda: None)
    x, y = digits.load_digits()
    assert np.array_equal(x, expected_x) and np.array_equal(y, expected_y)
