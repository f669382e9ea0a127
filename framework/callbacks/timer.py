"""Stop a fit after a given training time, and report the time each stage took (Lightning's ``Timer``).

The training clock runs from ``on_train_start`` to ``on_train_end`` (set-up and the sanity check
are not counted), plus the training time of the run a checkpoint was written in: a resumed fit
carries it on (``state_dict``), and one whose time is already up stops before its first batch.
After each training batch (``interval="step"``) or each epoch (``"epoch"``) rank 0's clock decides
and every rank hears its answer (a broadcast), so all stop at the same batch; the stop goes through
``trainer.should_stop`` as EarlyStopping's does (the epoch ends as a cut-short epoch, its end hooks
run, and ``min_epochs`` still hold). ``Trainer(max_time=...)`` is the Trainer's own limit, checked
in the loop; this callback is for code written against Lightning's and for its time queries.
"""

from __future__ import annotations

import re
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from framework.callbacks.base import Callback
from framework.errors import ConfigError, did_you_mean
from framework.rank_zero import rank_zero_info

if TYPE_CHECKING:
    from framework.module import TrainModule
    from framework.trainer import Trainer

#: Lightning's ``RunningStage`` values, the stages a Timer keys its times by
STAGES = ("train", "sanity_check", "validate", "test", "predict")
_INTERVALS = ("step", "epoch")


def parse_duration(duration: str | timedelta | dict[str, int] | None) -> float | None:
    """Seconds from ``"DD:HH:MM:SS"``, a ``timedelta`` or ``timedelta``'s keywords; None: no limit."""
    if duration is None:
        return None
    if isinstance(duration, str):
        match = re.fullmatch(r"(\d+):(\d\d):(\d\d):(\d\d)", duration.strip())
        if not match:
            raise ConfigError(f"Timer(duration={duration!r}) is not a duration: give 'DD:HH:MM:SS' (e.g. '00:12:00:00'), "
                              "a datetime.timedelta or a dict such as {'hours': 12}")
        days, hours, minutes, seconds = (int(g) for g in match.groups())
        duration = timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
    elif isinstance(duration, dict):
        try:
            duration = timedelta(**duration)
        except TypeError as err:
            raise ConfigError(f"Timer(duration={duration!r}): {err}; use timedelta's keywords (weeks, days, hours, "
                              "minutes, seconds, ...)") from None
    if not isinstance(duration, timedelta):
        raise ConfigError(f"Timer(duration={duration!r}) must be 'DD:HH:MM:SS', a datetime.timedelta or a dict")
    return duration.total_seconds()


class Timer(Callback):
    """Track the time of the training, validation and test loops; stop training after ``duration``.

    Args:
        duration: ``"DD:HH:MM:SS"``, a ``datetime.timedelta`` or a dict of its keywords; None:
            only measure.
        interval: check after every training batch (``"step"``) or at each epoch's end (``"epoch"``).
        verbose: say (rank 0, stderr) when the time is up.

    Raises:
        ConfigError: on a duration in another format or an unknown ``interval``.
    """

    def __init__(self, duration: str | timedelta | dict[str, int] | None = None, interval: str = "step",
                 verbose: bool = True) -> None:
        if interval not in _INTERVALS:
            raise ConfigError(f"Timer(interval={interval!r}) must be 'step' or 'epoch'{did_you_mean(str(interval), _INTERVALS)}")
        self._duration = parse_duration(duration)
        self._interval = interval
        self._verbose = verbose
        self._start_time: dict[str, float | None] = dict.fromkeys(STAGES)
        self._end_time: dict[str, float | None] = dict.fromkeys(STAGES)
        self._offset = 0.0  # training seconds of the run the resumed checkpoint came from

    @staticmethod
    def _stage(stage: str) -> str:
        stage = str(getattr(stage, "value", stage))  # Lightning's RunningStage enum, or its value
        if stage not in STAGES:
            raise ConfigError(f"Timer: unknown stage {stage!r}{did_you_mean(stage, STAGES)}; one of {', '.join(STAGES)}")
        return stage

    def start_time(self, stage: str = "train") -> float | None:
        """When ``stage`` last started (``time.monotonic()`` seconds), or None."""
        return self._start_time[self._stage(stage)]

    def end_time(self, stage: str = "train") -> float | None:
        """When ``stage`` last ended (``time.monotonic()`` seconds), or None."""
        return self._end_time[self._stage(stage)]

    def time_elapsed(self, stage: str = "train") -> float:
        """Seconds ``stage`` has run (training: with the time carried from a checkpoint)."""
        stage = self._stage(stage)
        start, end = self._start_time[stage], self._end_time[stage]
        offset = self._offset if stage == "train" else 0.0
        if start is None:
            return offset
        return (time.monotonic() if end is None else end) - start + offset

    def time_remaining(self, stage: str = "train") -> float | None:
        """Seconds left of ``duration`` (negative once it is past), or None without one."""
        return None if self._duration is None else self._duration - self.time_elapsed(stage)

    # -- hooks ------------------------------------------------------------------------------------
    def _started(self, stage: str) -> None:
        self._start_time[stage], self._end_time[stage] = time.monotonic(), None

    def _ended(self, stage: str) -> None:
        self._end_time[stage] = time.monotonic()

    def on_train_start(self, trainer: Trainer, module: TrainModule) -> None:
        self._started("train")

    def on_train_end(self, trainer: Trainer, module: TrainModule) -> None:
        self._ended("train")

    def on_validation_start(self, trainer: Trainer, module: TrainModule) -> None:
        self._started("validate")

    def on_validation_end(self, trainer: Trainer, module: TrainModule) -> None:
        self._ended("validate")

    def on_test_start(self, trainer: Trainer, module: TrainModule) -> None:
        self._started("test")

    def on_test_end(self, trainer: Trainer, module: TrainModule) -> None:
        self._ended("test")

    def on_fit_start(self, trainer: Trainer, module: TrainModule) -> None:
        # after a checkpoint was loaded: a fit whose time is already up stops before it trains
        if self._duration is not None:
            self._check_time_remaining(trainer)

    def on_train_batch_end(self, trainer: Trainer, module: TrainModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self._interval == "step" and self._duration is not None:
            self._check_time_remaining(trainer)

    def on_train_epoch_end(self, trainer: Trainer, module: TrainModule) -> None:
        if self._interval == "epoch" and self._duration is not None:
            self._check_time_remaining(trainer)

    def _check_time_remaining(self, trainer: Trainer) -> None:
        assert self._duration is not None
        should_stop = bool(trainer.strategy.broadcast(self.time_elapsed() >= self._duration))  # rank 0's clock
        trainer.should_stop = trainer.should_stop or should_stop
        if should_stop and self._verbose:
            elapsed = timedelta(seconds=int(self.time_elapsed()))
            rank_zero_info(f"Time limit reached. Elapsed time is {elapsed}. Signaling Trainer to stop.")

    # -- state ------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"time_elapsed": {stage: self.time_elapsed(stage) for stage in STAGES}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._offset = float(state.get("time_elapsed", {}).get("train", 0.0))
