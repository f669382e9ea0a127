"""The batch without a closure (``loops/training_step.py``'s ``train_batch`` calling 1-4 and 5-7
itself, with or without hooks between them) gives exactly what the closure path gives (an
``optimizer_step`` override calling ``optimizer.step(closure=optimizer_closure)``, Lightning's
default written out): the same weights bit for bit, the same skipped batches (a step that returns
None, a non-finite loss under ``on_nonfinite=skip``), the same outputs handed to ``on_train_batch_end``."""

from __future__ import annotations

import pytest
import torch
from toy import QUIET, LinearModel, loader, regression_data

import framework as fw
import framework.loops.training_step as training_step


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
    """The same, with a hook between the backward and the step: still no closure."""

    def on_before_optimizer_step(self, optimizer):
        pass


class UnevenThroughTheClosure(Uneven):
    """The same, with Lightning's default optimizer_step written out: the closure path."""

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None):
        optimizer.step(closure=optimizer_closure)


def _fit(model_cls: type[Uneven], monkeypatch: pytest.MonkeyPatch) -> tuple[Uneven, int]:
    closure_batches = []
    call = training_step.Closure.__call__

    def counting(closure):
        closure_batches.append(closure.batch_idx)
        return call(closure)

    monkeypatch.setattr(training_step.Closure, "__call__", counting)
    torch.manual_seed(0)
    model = model_cls()
    trainer = fw.Trainer(**QUIET, max_epochs=2, on_nonfinite="skip")
    with pytest.warns(UserWarning, match="non-finite loss at step 5"):
        trainer.fit(model, loader(regression_data(48), 8))
    return model, len(closure_batches)


def test_the_batch_without_a_closure_gives_the_closures_numbers(monkeypatch):
    plain, plain_closures = _fit(Uneven, monkeypatch)
    hooked, hooked_closures = _fit(UnevenWithAHook, monkeypatch)
    closure, closure_batches = _fit(UnevenThroughTheClosure, monkeypatch)
    assert (plain_closures, hooked_closures, closure_batches) == (0, 0, 12)  # each path was taken
    for a, b, c in zip(plain.parameters(), hooked.parameters(), closure.parameters(), strict=True):
        assert torch.equal(a, b) and torch.equal(a, c)
    assert plain.seen == hooked.seen == closure.seen
    assert [idx for idx, keys, _ in plain.seen if not keys] == [2, 2]  # None: {} handed on
    assert next(loss for idx, _, loss in plain.seen if idx == 4) == "nan"  # step 5: handed on, not stepped
    assert plain.trainer.global_step == closure.trainer.global_step == 12  # every batch counts, as in Lightning


class Recording(LinearModel):
    """Adam; records the hooks around the backward and the step, in the order they run."""

    def __init__(self) -> None:
        super().__init__(optimizer="adam")
        self.calls: list = []

    def on_before_zero_grad(self, optimizer):
        self.calls.append(("on_before_zero_grad", self.trainer.global_step))

    def on_before_backward(self, loss):
        self.calls.append(("on_before_backward", self.trainer.global_step))

    def on_after_backward(self):
        self.calls.append(("on_after_backward", self.trainer.global_step))

    def on_before_optimizer_step(self, optimizer):
        self.calls.append(("on_before_optimizer_step", self.trainer.global_step))


class RecordingThroughTheClosure(Recording):
    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None):
        self.calls.append(("optimizer_step", batch_idx))
        optimizer.step(closure=optimizer_closure)


def _fit_with(model_cls: type[LinearModel], settings: dict) -> LinearModel:
    torch.manual_seed(0)
    model = model_cls() if model_cls is not LinearModel else LinearModel(optimizer="adam")
    fw.Trainer(**QUIET, max_epochs=2, **settings).fit(model, loader(regression_data(40), 8))
    return model


@pytest.mark.parametrize("settings", [
    {}, {"accumulate_grad_batches": 2}, {"gradient_clip_val": 0.05},
    {"gradient_clip_val": 0.05, "gradient_clip_algorithm": "value", "accumulate_grad_batches": 3},
    {"precision": "16-mixed", "accumulate_grad_batches": 2, "gradient_clip_val": 0.05},
    {"precision": "bf16-mixed"},
], ids=["plain", "accumulate", "clip", "clip-value-accumulate", "16-mixed", "bf16-mixed"])
def test_the_hooks_and_the_closure_change_no_number(settings):
    """The same fit without hooks, with hooks at every place of 1-7 (zero_grad then moves to a
    window's start), and through an optimizer_step override's closure: the same weights bit for
    bit, and the hooks at the same places with and without the closure."""
    plain = _fit_with(LinearModel, settings)
    hooked = _fit_with(Recording, settings)
    closure = _fit_with(RecordingThroughTheClosure, settings)
    for a, b, c in zip(plain.parameters(), hooked.parameters(), closure.parameters(), strict=True):
        assert torch.equal(a, b) and torch.equal(a, c)
    assert hooked.calls == [call for call in closure.calls if call[0] != "optimizer_step"]
    steps = plain.trainer.global_step
    assert len([call for call in closure.calls if call[0] == "optimizer_step"]) == steps
    assert [name for name, _ in hooked.calls].count("on_before_optimizer_step") == steps
