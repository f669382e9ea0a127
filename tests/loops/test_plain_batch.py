"""The batch without a closure (``loops/optimization.py``'s ``_plain_batch_fn``, taken where
nothing runs between training_step, the backward and the step) gives exactly what the closure
path gives: the same weights bit for bit, the same skipped batches (a step that returns None, a
non-finite loss under ``on_nonfinite=skip``), the same outputs handed to ``on_train_batch_end``."""

from __future__ import annotations

import pytest
import torch
from toy import QUIET, LinearModel, loader, regression_data

import framework as fw
import framework.loops.optimization as optimization


class Uneven(LinearModel):
    """Adam; returns a dict, None on batch 2 of every epoch, a NaN loss at global step 5."""

    def __init__(self) -> None:
        super().__init__(optimizer="adam")
        self.seen: list = []

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        if batch_idx == 2:
            return None
        if self.global_step + 1 == 5:
            loss = loss * float("nan")
        return {"loss": loss, "kept": batch_idx}

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.seen.append((batch_idx, sorted(outputs), repr(float(outputs["loss"])) if outputs else None))  # nan == nan


class UnevenWithAHook(Uneven):
    """The same, with a hook between the backward and the step: the closure path."""

    def on_before_optimizer_step(self, optimizer):
        pass


def _fit(model_cls: type[Uneven], monkeypatch: pytest.MonkeyPatch) -> tuple[Uneven, int]:
    plain_batches = []
    build = optimization._plain_batch_fn

    def counting(*args):
        step = build(*args)

        def batch(*batch_args):
            plain_batches.append(batch_args[1])
            return step(*batch_args)

        return batch

    monkeypatch.setattr(optimization, "_plain_batch_fn", counting)
    torch.manual_seed(0)
    model = model_cls()
    trainer = fw.Trainer(**QUIET, max_epochs=2, on_nonfinite="skip")
    with pytest.warns(UserWarning, match="non-finite loss at step 5"):
        trainer.fit(model, loader(regression_data(48), 8))
    return model, len(plain_batches)


def test_the_batch_without_a_closure_gives_the_closures_numbers(monkeypatch):
    plain, plain_batches = _fit(Uneven, monkeypatch)
    closure, closure_batches = _fit(UnevenWithAHook, monkeypatch)
    assert (plain_batches, closure_batches) == (12, 0)  # each path was taken
    for a, b in zip(plain.parameters(), closure.parameters(), strict=True):
        assert torch.equal(a, b)
    assert plain.seen == closure.seen
    assert [idx for idx, keys, _ in plain.seen if not keys] == [2, 2]  # None: {} handed on
    assert [loss for idx, _, loss in plain.seen if idx == 4][0] == "nan"  # step 5: handed on, not stepped
    assert plain.trainer.global_step == closure.trainer.global_step == 12  # every batch counts, as in Lightning
