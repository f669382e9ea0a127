"""What code outside ``framework/trainer/`` may change on a Trainer, each through a named method
(Lightning's public ``trainer.should_stop = True`` aside, ``properties.py``):

- the Tuner's trials on the user's Trainer (``framework/tuner/trials.py``): ``keep_parts`` what
  a trial changes, ``lend_parts`` it other settings, callbacks and loggers (and a fresh state)
  for each trial, ``restore_parts`` the user's afterwards;
- ``StochasticWeightAveraging``: ``swap_lr_scheduler`` (SWALR in the place of the module's),
  ``add_epochs`` (its BatchNorm epoch) and ``set_forward_only`` (that epoch without a backward);
- ``LearningRateMonitor``: ``add_callback_metrics`` (the learning rates, for a monitor).

``tests/test_shape.py`` checks that nothing else outside this package changes a Trainer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from framework.run_state.state import RunState

if TYPE_CHECKING:
    import torch

    from framework.callbacks.base import Callback
    from framework.loggers.base import Logger
    from framework.optim import LRSchedulerConfig
    from framework.run_state.metrics import LoggedMetrics
    from framework.trainer.fit_loop_view import FitLoopView
    from framework.trainer.run import Run
    from framework.trainer.settings import Settings


@dataclasses.dataclass(frozen=True)
class KeptParts:
    """What trials on a Trainer change, as it was before them (``Trainer.keep_parts``)."""

    settings: Settings
    callbacks: list[Callback]
    loggers: list[Logger]
    run: Run | None
    last_fit: Run | None
    batch_counts: dict[str, list[int | float]]
    state: dict[str, Any]  # the RunState's fields


class TrainerControls:
    """Mixed into ``Trainer``."""

    settings: Settings
    callbacks: list[Callback]
    loggers: list[Logger]
    run: Run | None
    last_fit: Run | None
    batch_counts: dict[str, list[int | float]]
    state: RunState
    fit_loop: FitLoopView
    _no_metrics: LoggedMetrics

    # -- trials on the user's Trainer (the Tuner) ----------------------------------------------------
    def keep_parts(self) -> KeptParts:
        """The settings, callbacks, loggers, state and what the Trainer keeps between calls
        (``run``, ``last_fit``, ``batch_counts``) as they are now, for ``restore_parts``."""
        return KeptParts(self.settings, self.callbacks, self.loggers, self.run, self.last_fit,
                         dict(self.batch_counts), _fields(self.state))

    def lend_parts(self, settings: Settings, callbacks: list[Callback], loggers: list[Logger]) -> None:
        """For one trial: these settings, callbacks and loggers, and a fresh state (step 0, epoch 0;
        the same ``RunState`` object, its fields reset)."""
        self.settings, self.callbacks, self.loggers = settings, callbacks, loggers
        _set_fields(self.state, _fields(RunState()))

    def restore_parts(self, kept: KeptParts) -> None:
        """Everything ``keep_parts`` kept, put back."""
        self.settings, self.callbacks, self.loggers = kept.settings, kept.callbacks, kept.loggers
        self.run, self.last_fit, self.batch_counts = kept.run, kept.last_fit, kept.batch_counts
        _set_fields(self.state, kept.state)

    # -- StochasticWeightAveraging -------------------------------------------------------------------
    def swap_lr_scheduler(self, config: LRSchedulerConfig) -> LRSchedulerConfig | None:
        """``config`` in the place of the last (or running) fit's first scheduler, which it
        returns; added, and None returned, where the fit has none (as Lightning's SWA changes
        ``trainer.lr_scheduler_configs``)."""
        configs = self.last_fit.lr_scheduler_configs if self.last_fit is not None else []
        if not configs:
            configs.append(config)
            return None
        displaced, configs[0] = configs[0], config
        return displaced

    def add_epochs(self, count: int) -> None:
        """``max_epochs`` raised by ``count`` (lowered where negative), for the running fit (read
        at its next epoch) and the next, as ``trainer.fit_loop.max_epochs += count``."""
        self.fit_loop.max_epochs = self.settings.max_epochs + count

    def set_forward_only(self, value: bool) -> None:
        """Whether the fit's next training epochs run ``training_step`` alone, without a backward
        or an optimizer step (``RunState.forward_only``; Lightning's ``fit_loop._skip_backward``)."""
        self.state.forward_only = bool(value)

    # -- LearningRateMonitor -------------------------------------------------------------------------
    def add_callback_metrics(self, values: Mapping[str, torch.Tensor]) -> None:
        """``values`` among ``trainer.callback_metrics`` (what ModelCheckpoint and EarlyStopping
        monitor), as Lightning's LearningRateMonitor adds its learning rates there."""
        metrics = self.run.metrics if self.run is not None else self._no_metrics
        metrics.callback_metrics.update(values)


def _fields(state: RunState) -> dict[str, Any]:
    """The state's fields as they are (the loops replace what a fresh state gets, never these)."""
    return {field.name: getattr(state, field.name) for field in dataclasses.fields(state)}


def _set_fields(state: RunState, values: dict[str, Any]) -> None:
    for name, value in values.items():
        setattr(state, name, value)
