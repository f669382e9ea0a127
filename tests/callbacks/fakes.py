"""Fakes of the Trainer and its strategy for callback unit tests, checked against the real
classes so that they cannot drift from the real interface (a drifted fake once hid a bug)."""

from __future__ import annotations

import inspect

from toy import QUIET

import framework as fw


def assert_matches_real(fake: object, real: object) -> None:
    """Every public name ``fake`` has exists on ``real`` (an instance of the real class), and
    every method the fake defines takes the parameters the real method takes, by name."""
    names = {n for n in dir(fake) if not n.startswith("_")}
    extra = {"TEST_ONLY", *getattr(fake, "TEST_ONLY", ())}  # what the test itself records
    for name in sorted(names - set(extra)):
        assert hasattr(real, name), f"{type(fake).__name__}.{name}: the real {type(real).__name__} has no '{name}'"
        fake_attr, real_attr = getattr(fake, name), getattr(real, name)
        if inspect.ismethod(fake_attr):
            assert callable(real_attr), f"{name} is a method on the fake but not on the real {type(real).__name__}"
            fake_params = list(inspect.signature(fake_attr).parameters)
            real_params = list(inspect.signature(real_attr).parameters)
            assert fake_params == real_params, f"{name}{fake_params} != real {name}{real_params}"
        else:
            assert not callable(real_attr) or isinstance(real_attr, (dict, list)), (
                f"{name} is data on the fake but a method on the real {type(real).__name__}")


def real_trainer(**overrides) -> fw.Trainer:
    return fw.Trainer(**{**QUIET, **overrides})
