"""EarlyStopping against a fake Trainer, checked against the real one (last test)."""

import math

import pytest
import torch

from framework.callbacks import EarlyStopping
from framework.errors import ConfigError

from .fakes import assert_matches_real, real_trainer


class FakeStrategy:
    TEST_ONLY = ("others_say", "calls")

    def __init__(self, others_say=False):
        self.others_say = others_say  # what the other ranks decided
        self.calls = []

    def reduce_boolean_decision(self, decision, all=True):
        self.calls.append((decision, all))
        return (decision and self.others_say) if all else (decision or self.others_say)


class FakeTrainer:
    def __init__(self, strategy=None):
        self.current_epoch = 0
        self.sanity_checking = False
        self.should_stop = False
        self.callback_metrics = {}
        self.strategy = strategy or FakeStrategy()
        self.fast_dev_run = 0
        self.val_check_interval = 1.0  # validation once an epoch: EarlyStopping checks at its end
        self.check_val_every_n_epoch = 1


def run(cb, values, key="val/loss", validate=True, trainer=None):
    """Fit until the trainer stops; return the epoch it stopped after (or None)."""
    trainer = trainer or FakeTrainer()
    cb.setup(trainer, None, "fit")
    cb.on_fit_start(trainer, None)
    for epoch, value in enumerate(values):
        trainer.current_epoch = epoch
        cb.on_train_epoch_start(trainer, None)
        trainer.callback_metrics = {key: torch.tensor(value)}
        if validate:
            cb.on_validation_end(trainer, None)
        cb.on_train_epoch_end(trainer, None)
        if trainer.should_stop:
            return epoch
    return None


def test_patience_min():
    cb = EarlyStopping("val/loss", patience=2)
    assert run(cb, [1.0, 0.8, 0.9, 0.85, 0.7]) == 3
    assert cb.stopped_epoch == 3 and cb.wait_count == 2 and cb.best_score == pytest.approx(0.8)


def test_patience_max():
    cb = EarlyStopping("val/acc", mode="max", patience=1)
    assert run(cb, [0.5, 0.6, 0.6], key="val/acc") == 2  # equal is not better


def test_improvement_resets_wait():
    cb = EarlyStopping("val/loss", patience=2)
    assert run(cb, [1.0, 1.1, 0.9, 1.0, 0.95, 0.91]) == 4


def test_min_delta():
    cb = EarlyStopping("val/loss", patience=2, min_delta=0.1)
    # 0.95 and 0.92 improve on 1.0 by less than 0.1: they don't count
    assert run(cb, [1.0, 0.95, 0.92]) == 2
    assert cb.best_score == pytest.approx(1.0)
    cb = EarlyStopping("val/acc", mode="max", patience=1, min_delta=0.05)
    assert run(cb, [0.5, 0.6, 0.62], key="val/acc") == 2


def test_thresholds_and_non_finite():
    assert run(EarlyStopping("val/loss", patience=10, stopping_threshold=0.1), [1.0, 0.5, 0.05, 0.01]) == 2
    assert run(EarlyStopping("val/loss", patience=10, divergence_threshold=5.0), [1.0, 6.0, 0.5]) == 1
    assert run(EarlyStopping("val/loss", patience=10), [1.0, math.nan, 0.5]) == 1
    assert run(EarlyStopping("val/loss", patience=10, check_finite=False), [1.0, math.inf, 0.5]) is None


def test_not_during_sanity_check_nor_outside_fit():
    cb = EarlyStopping("val/loss", patience=0)
    trainer = FakeTrainer()
    trainer.callback_metrics = {"val/loss": torch.tensor(1.0)}
    cb.on_validation_end(trainer, None)  # stand-alone validate: no fit started
    cb.on_fit_start(trainer, None)
    trainer.sanity_checking = True
    cb.on_validation_end(trainer, None)
    assert cb.best_score == math.inf and not trainer.should_stop


def test_checks_at_train_epoch_end_without_validation():
    cb = EarlyStopping("train/loss", patience=1)
    assert run(cb, [1.0, 1.0], key="train/loss", validate=False) == 1


def test_validating_every_other_epoch_checks_after_validation_only_as_lightning():
    # check_on_train_epoch_end=None: Lightning decides at setup; validation that is not once an
    # epoch means the check runs after each validation, never on a stale value in between
    cb = EarlyStopping("val/loss", patience=1)
    trainer = FakeTrainer()
    trainer.check_val_every_n_epoch = 2
    cb.setup(trainer, None, "fit")
    cb.on_fit_start(trainer, None)
    trainer.callback_metrics = {"val/loss": torch.tensor(1.0)}
    cb.on_validation_end(trainer, None)
    for _ in range(3):  # epochs without validation: the old value is not counted again
        cb.on_train_epoch_end(trainer, None)
    assert (cb.wait_count, trainer.should_stop, float(cb.best_score)) == (0, False, 1.0)
    assert cb._check_on_train_epoch_end is False


def test_the_decision_is_made_once_as_in_lightning():
    cb = EarlyStopping("val/loss")
    trainer = FakeTrainer()
    cb.setup(trainer, None, "fit")
    trainer.check_val_every_n_epoch = 3
    cb.setup(trainer, None, "fit")  # a second fit keeps the first decision, as Lightning's does
    assert cb._check_on_train_epoch_end is True and cb.check_on_train_epoch_end is None


def test_strict_missing_metric_raises_with_available_keys():
    cb = EarlyStopping("val/los")
    trainer = FakeTrainer()
    cb.on_fit_start(trainer, None)
    trainer.callback_metrics = {"val/loss": torch.tensor(1.0), "train/loss": torch.tensor(2.0)}
    with pytest.raises(ConfigError) as info:
        cb.on_validation_end(trainer, None)
    assert "did you mean 'val/loss'" in str(info.value) and "train/loss" in str(info.value)
    lenient = EarlyStopping("val/los", strict=False)
    lenient.on_fit_start(trainer, None)
    with pytest.warns(UserWarning, match=r"found no metric 'val/los'"):
        lenient.on_validation_end(trainer, None)


def test_decision_is_reduced_across_ranks():
    # Another rank wants to stop: everyone stops (any-rank semantics).
    strategy = FakeStrategy(others_say=True)
    trainer = FakeTrainer(strategy)
    assert run(EarlyStopping("val/loss", patience=5), [1.0], trainer=trainer) == 0
    assert strategy.calls == [(False, False)]


def test_check_on_train_epoch_end_explicit():
    cb = EarlyStopping("val/loss", patience=1, check_on_train_epoch_end=True)
    trainer = FakeTrainer()
    cb.on_fit_start(trainer, None)
    trainer.callback_metrics = {"val/loss": torch.tensor(1.0)}
    cb.on_validation_end(trainer, None)
    assert cb.best_score == math.inf  # not checked after validation
    cb.on_train_epoch_end(trainer, None)
    assert cb.best_score == 1.0


def test_state_dict_round_trip():
    cb = EarlyStopping("val/loss", patience=3)
    run(cb, [1.0, 1.1, 1.2])
    resumed = EarlyStopping("val/loss", patience=3)
    resumed.load_state_dict(cb.state_dict())
    assert (resumed.wait_count, resumed.best_score) == (2, 1.0)
    assert run(resumed, [1.3]) == 0


@pytest.mark.parametrize(("kwargs", "match"), [({"mode": "mn"}, "did you mean 'min'"), ({"patience": -1}, "patience")])
def test_invalid_arguments(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        EarlyStopping("val/loss", **kwargs)


def test_the_fakes_have_the_real_interface():
    real = real_trainer()
    assert_matches_real(FakeTrainer(), real)
    assert_matches_real(FakeStrategy(), real.strategy)
