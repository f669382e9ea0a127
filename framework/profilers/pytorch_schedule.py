"""What ``PyTorchProfiler`` adds around ``torch.profiler``: a schedule that counts the steps of
each kind (training, validation, test, predict) on its own, and ranges named after the module's
submodules (Lightning's ``ScheduleWrapper`` and ``RegisterRecordFunction``)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerAction

#: the step actions, by the suffix of their action name, in the order they are checked
STEP_KINDS = ("training_step", "validation_step", "test_step", "predict_step")


class ScheduleWrapper:
    """A ``torch.profiler`` schedule that ignores the profiler's own step number: each kind of
    step is counted apart, so that validation steps inside a fit do not move training's
    schedule. Once a kind's schedule reached ``RECORD_AND_SAVE`` that kind records no more.

    Args:
        schedule: the user's (or the default) ``torch.profiler.schedule``, called with the
            current kind's step count.
    """

    def __init__(self, schedule: Callable[[int], ProfilerAction]) -> None:
        self._schedule = schedule
        self.reset()

    def reset(self) -> None:
        self._steps = dict.fromkeys(STEP_KINDS, 0)
        self._finished = dict.fromkeys(STEP_KINDS, False)
        self._current_action: str | None = None
        self._prev_schedule_action: ProfilerAction | None = None

    def pre_step(self, current_action: str) -> None:
        """The step action that is about to call ``profiler.step()``."""
        self._current_action = current_action

    @property
    def _kind(self) -> str | None:
        action = self._current_action or ""
        return next((kind for kind in STEP_KINDS if action.endswith(kind)), None)

    @property
    def num_step(self) -> int:
        kind = self._kind
        return self._steps[kind] if kind is not None else 0

    @property
    def is_training(self) -> bool:
        return self._kind == "training_step"

    def __call__(self, num_step: int) -> ProfilerAction:
        kind = self._kind
        if kind is None or self._finished[kind]:
            return ProfilerAction.NONE
        self._steps[kind] += 1
        action = self._schedule(max(self._steps[kind], 0))
        if self._prev_schedule_action == ProfilerAction.RECORD and action == ProfilerAction.WARMUP:
            # validation recording before training reaches its own recording: torch.profiler
            # refuses to go from RECORD back to WARMUP, so keep recording (Lightning's rule)
            action = ProfilerAction.RECORD
        if action == ProfilerAction.RECORD_AND_SAVE:
            self._finished[kind] = True
        self._prev_schedule_action = action
        return action


class RegisterRecordFunction:
    """While entered, every submodule's forward runs inside a ``record_function`` range named
    ``[pl][module]{module.__module__}.{Class}: {name}`` (Lightning's label), so the trace shows
    which layer an operator ran in."""

    def __init__(self, model: torch.nn.Module) -> None:
        self._model = model
        self._records: dict[str, Any] = {}
        self._handles: list[Any] = []

    def _start(self, _: torch.nn.Module, inputs: Any, record_name: str) -> Any:
        record = record_function("[pl][module]" + record_name)
        record.__enter__()
        self._records[record_name] = record
        return inputs

    def _stop(self, _: torch.nn.Module, __: Any, output: Any, record_name: str) -> Any:
        record = self._records.pop(record_name, None)
        if record is not None:
            record.__exit__(None, None, None)
        return output

    def __enter__(self) -> None:
        for name, module in self._model.named_modules():
            if name:
                record_name = f"{type(module).__module__}.{type(module).__name__}: {name}"
                self._handles.append(module.register_forward_pre_hook(partial(self._start, record_name=record_name)))
                self._handles.append(module.register_forward_hook(partial(self._stop, record_name=record_name)))

    def __exit__(self, *exc: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
