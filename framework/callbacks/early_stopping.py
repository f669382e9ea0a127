"""Stop training when a monitored metric stops improving.

The check runs where Lightning's does: at the end of each training epoch (after the validation
that ends it, if any) when validation runs once an epoch or not at all, else after each
validation run of ``fit`` (never during the sanity check). The decision is reduced across ranks
(any rank that wants to stop stops all), and training stops by setting ``trainer.should_stop``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from framework.callbacks.base import Callback
from framework.errors import ConfigError, did_you_mean
from framework.rank_zero import rank_zero_info, rank_zero_warn

if TYPE_CHECKING:
    from framework.module import TrainModule
    from framework.trainer import Trainer


class EarlyStoppingReason(Enum):
    """Why an EarlyStopping stopped the fit (Lightning's values)."""

    NOT_STOPPED = 0
    STOPPING_THRESHOLD = 1
    DIVERGENCE_THRESHOLD = 2
    PATIENCE_EXHAUSTED = 3
    NON_FINITE_METRIC = 4


class EarlyStopping(Callback):
    """Stop when ``monitor`` has not improved by more than ``min_delta`` for ``patience`` checks.

    Args:
        monitor: Key of ``trainer.callback_metrics`` to watch, e.g. ``"val/loss"``.
        mode: ``"min"`` or ``"max"``: which way is better.
        patience: How many checks without improvement to allow before stopping.
        min_delta: An improvement smaller than this does not count.
        check_on_train_epoch_end: ``True``: check only at the end of each training epoch;
            ``False``: only after validation; ``None`` (default): as Lightning decides it at the
            first set-up, ``True`` when validation runs once an epoch (``val_check_interval=1.0``
            and ``check_val_every_n_epoch=1``, or no validation), else ``False``.
        strict: Raise if ``monitor`` is missing when checked after validation (or at train
            epoch end when ``check_on_train_epoch_end=True``); otherwise warn and skip.
        verbose: Print why the best score changed or training stopped.
        stopping_threshold: Stop as soon as the metric is better than this.
        divergence_threshold: Stop as soon as the metric is worse than this.
        check_finite: Stop when the metric becomes NaN or infinite.
        log_rank_zero_only: Lightning's choice of which ranks print ``verbose``'s lines; fw
            prints them on rank 0 either way.

    The arguments are Lightning's, in its order; ``best_score`` is a tensor and ``patience`` is
    saved and restored with the callback's state, as in Lightning.

    Raises:
        ConfigError: On an invalid ``mode`` or ``patience``, and (``strict``) a missing metric.
    """

    mode_dict: ClassVar[dict[str, Callable[..., Any]]] = {"min": torch.lt, "max": torch.gt}
    order_dict: ClassVar[dict[str, str]] = {"min": "<", "max": ">"}

    def __init__(self, monitor: str, min_delta: float = 0.0, patience: int = 3, verbose: bool = False,
                 mode: str = "min", strict: bool = True, check_finite: bool = True,
                 stopping_threshold: float | None = None, divergence_threshold: float | None = None,
                 check_on_train_epoch_end: bool | None = None, log_rank_zero_only: bool = False) -> None:
        if mode not in ("min", "max"):
            raise ConfigError(f"EarlyStopping(mode={mode!r}) must be 'min' or 'max'{did_you_mean(mode, ['min', 'max'])}")
        if not isinstance(patience, int) or patience < 0:
            raise ConfigError(f"EarlyStopping(patience={patience!r}) must be an int >= 0")
        self.monitor = monitor
        self.mode = mode
        self.patience = patience
        self.min_delta = float(min_delta)  # signed, as in Lightning: a negative one lets a slight worsening count
        self.check_on_train_epoch_end = check_on_train_epoch_end
        self._check_on_train_epoch_end = check_on_train_epoch_end  # None: decided at the first setup
        self.strict = strict
        self.verbose = verbose
        self.stopping_threshold = stopping_threshold
        self.divergence_threshold = divergence_threshold
        self.check_finite = check_finite

        self.wait_count = 0
        self.stopped_epoch = 0
        self.stopping_reason = EarlyStoppingReason.NOT_STOPPED
        self.stopping_reason_message: str | None = None
        self.best_score = torch.tensor(math.inf if mode == "min" else -math.inf)
        self._fitting = False
        self._warned_missing = False

    @property
    def state_key(self) -> str:
        return f"EarlyStopping{{'monitor': {self.monitor!r}, 'mode': {self.mode!r}}}"

    @property
    def monitor_op(self) -> Callable[..., Any]:
        return self.mode_dict[self.mode]

    # -- hooks ----------------------------------------------------------------------------
    def setup(self, trainer: Trainer, module: TrainModule, stage: str) -> None:
        if self._check_on_train_epoch_end is None:  # once, as in Lightning (later fits keep it)
            self._check_on_train_epoch_end = trainer.val_check_interval == 1.0 and trainer.check_val_every_n_epoch == 1

    def on_fit_start(self, trainer: Trainer, module: TrainModule) -> None:
        self._fitting = True

    def on_fit_end(self, trainer: Trainer, module: TrainModule) -> None:
        self._fitting = False

    def on_exception(self, trainer: Trainer, module: TrainModule, exception: BaseException) -> None:
        self._fitting = False

    def on_validation_end(self, trainer: Trainer, module: TrainModule) -> None:
        # Not during the sanity check, nor in a stand-alone trainer.validate().
        if not self._check_on_train_epoch_end and self._fitting and not trainer.sanity_checking:
            self._run_check(trainer)

    def on_train_epoch_end(self, trainer: Trainer, module: TrainModule) -> None:
        if self._check_on_train_epoch_end:
            self._run_check(trainer)

    # -- the check ------------------------------------------------------------------------
    def _run_check(self, trainer: Trainer) -> None:
        if trainer.fast_dev_run:  # a dev run stops nothing (Lightning's)
            return
        value = trainer.callback_metrics.get(self.monitor)
        if value is None:
            self._missing_monitor(trainer)
            return
        current = value.detach().clone().squeeze() if isinstance(value, torch.Tensor) else torch.tensor(float(value))
        why, reason = self._evaluate(current)
        should_stop = trainer.strategy.reduce_boolean_decision(why is not EarlyStoppingReason.NOT_STOPPED, all=False)
        trainer.should_stop = trainer.should_stop or should_stop
        if should_stop:
            self.stopped_epoch = trainer.current_epoch
            self.stopping_reason = why
            self.stopping_reason_message = reason or "another rank's check said to stop"
        if reason and self.verbose:
            rank_zero_info(f"EarlyStopping: {reason}")

    def _evaluate(self, current: torch.Tensor) -> tuple[EarlyStoppingReason, str | None]:
        """Update ``best_score``/``wait_count`` with ``current``; return (why stop, what to say).
        Compared in the metric's own dtype, as Lightning compares."""
        name, reason, better = self.monitor, EarlyStoppingReason, self.monitor_op
        best = self.best_score.to(current.device)
        if self.check_finite and not torch.isfinite(current):
            return reason.NON_FINITE_METRIC, f"{name} = {float(current)} is not finite (best was {float(best):.4g}); stopping."
        if self.stopping_threshold is not None and better(current, self.stopping_threshold):
            return (reason.STOPPING_THRESHOLD,
                    f"{name} = {float(current):.4g} reached stopping_threshold={self.stopping_threshold}; stopping.")
        if self.divergence_threshold is not None and better(-current, -self.divergence_threshold):
            return (reason.DIVERGENCE_THRESHOLD,
                    f"{name} = {float(current):.4g} passed divergence_threshold={self.divergence_threshold}; stopping.")
        delta = -self.min_delta if self.mode == "min" else self.min_delta
        if better(current - delta, best):
            improvement = (f"improved by {abs(float(current - best)):.4g}"
                           if torch.isfinite(best) else "first value")
            self.best_score, self.wait_count = current, 0
            return reason.NOT_STOPPED, f"{name} {improvement}: new best {float(current):.4g}."
        self.wait_count += 1
        if self.wait_count >= self.patience:
            return reason.PATIENCE_EXHAUSTED, (
                f"{name} did not improve by more than {self.min_delta} for {self.wait_count} checks; "
                f"best {float(best):.4g}; stopping.")
        return reason.NOT_STOPPED, None

    def _missing_monitor(self, trainer: Trainer) -> None:
        available = sorted(trainer.callback_metrics)
        message = (f"EarlyStopping(monitor={self.monitor!r}) found no metric {self.monitor!r} in "
                   f"trainer.callback_metrics{did_you_mean(self.monitor, available)}; available: {available}. "
                   f"HINT: log it with self.log({self.monitor!r}, value), or pass strict=False.")
        if self.strict:
            raise ConfigError(message)
        if not self._warned_missing:
            self._warned_missing = True
            rank_zero_warn(message)

    # -- state ----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"wait_count": self.wait_count, "stopped_epoch": self.stopped_epoch,
                "best_score": self.best_score, "patience": self.patience, "stopping_reason": self.stopping_reason.value,
                "stopping_reason_message": self.stopping_reason_message}

    def load_state_dict(self, state: dict) -> None:
        self.wait_count = state["wait_count"]
        self.stopped_epoch = state["stopped_epoch"]
        self.stopping_reason = EarlyStoppingReason(state.get("stopping_reason", 0))
        self.stopping_reason_message = state.get("stopping_reason_message")
        best = state["best_score"]  # fw's checkpoints before 2026-12-06 hold a float, and no patience
        self.best_score = best if isinstance(best, torch.Tensor) else torch.tensor(float(best))
        self.patience = state.get("patience", self.patience)  # the checkpoint's wins, as in Lightning
