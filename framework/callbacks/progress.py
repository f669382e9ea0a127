"""A progress bar for fit, validate, test and predict, drawn with rich, on global rank 0 only.

The per-batch cost is one counter increment and one ``time.monotonic()`` call: the display is
redrawn at most ``refresh_rate_hz`` times a second, and at the end of each epoch. ``rich`` is
imported when the first bar starts, not when this module is imported.

Everything goes to stderr (stdout is the program's). On a terminal the bars are live; at any width
the description, count, elapsed time, ETA and it/s stay whole and the metrics are cut first (with
"…"). Otherwise (a batch job's log file) nothing is redrawn; one line is logged per finished
training epoch and per stand-alone evaluation, so logs stay readable. The training bar shows the
training and validation metrics (``prog_bar=True``); a validate, test or predict bar shows only
what was logged in that stage.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from framework.callbacks.base import Callback
from framework.rank_zero import rank_zero_info

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, Task, TaskID

    from framework.module import TrainModule
    from framework.trainer import Trainer


def _format_metrics(metrics: dict[str, float]) -> str:
    return " ".join(f"{key}={value:.4g}" for key, value in metrics.items())


class RichProgressBar(Callback):
    """Show step, it/s, elapsed time, ETA and ``trainer.progress_bar_metrics``.

    Args:
        refresh_rate_hz: Most redraws per second; 0 redraws only at epoch ends.
        leave: Keep each finished training epoch's bar on screen (else one bar is reused).
    """

    def __init__(self, refresh_rate_hz: float = 10.0, leave: bool = True) -> None:
        self.refresh_interval = 1.0 / refresh_rate_hz if refresh_rate_hz > 0 else float("inf")
        self.leave = leave
        self._progress: Progress | None = None  # while a live display is up
        self._live = False  # False: plain lines (not a terminal); meaningful once started
        self._started = False
        self._in_fit = False  # between on_train_start and on_train_end
        self._train_active = False  # counting training batches on this rank
        self._eval_active = False
        self._train_task: TaskID | None = None
        self._eval_task: TaskID | None = None
        self._count = 0  # batches done in the current bar
        self._eval_count = 0
        self._epoch_start = self._eval_start_time = 0.0
        self._next_refresh = 0.0

    # -- life cycle -------------------------------------------------------------------------
    def _start(self, trainer: Trainer) -> bool:
        """Bring the display up on rank 0; return whether this rank shows anything."""
        if not trainer.is_global_zero:
            return False
        if not self._started:
            from rich.console import Console

            console = Console(stderr=True)
            self._live = console.is_terminal
            if self._live:
                self._progress = _make_progress(console)
                self._progress.start()
            self._started = True
        return True

    def _stop(self) -> None:
        if self._progress is not None:
            self._progress.refresh()
            self._progress.stop()
        self._progress = None
        self._started = self._in_fit = self._train_active = self._eval_active = False
        self._train_task = self._eval_task = None

    def on_train_start(self, trainer: Trainer, module: TrainModule) -> None:
        self._in_fit = True

    def on_train_end(self, trainer: Trainer, module: TrainModule) -> None:
        self._stop()

    def teardown(self, trainer: Trainer, module: TrainModule, stage: str) -> None:
        self._stop()

    def on_exception(self, trainer: Trainer, module: TrainModule, exception: BaseException) -> None:
        self._stop()

    # -- training ---------------------------------------------------------------------------
    def on_train_epoch_start(self, trainer: Trainer, module: TrainModule) -> None:
        if not self._start(trainer):
            return
        self._train_active = True
        self._count = 0
        self._epoch_start = time.monotonic()
        self._next_refresh = self._epoch_start + self.refresh_interval
        if self._progress is None:
            return
        batches = trainer.num_training_batches
        total = int(batches) if batches != float("inf") else None
        description = self._epoch_description(trainer)
        if self._train_task is not None and not self.leave:
            self._progress.reset(self._train_task, total=total, description=description, metrics="", rate=None)
        else:
            self._train_task = self._progress.add_task(description, total=total, metrics="", rate=None)

    def on_train_batch_end(self, trainer: Trainer, module: TrainModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if not self._train_active:
            return
        self._count += 1
        if self._train_task is None:
            return
        now = time.monotonic()
        if now >= self._next_refresh:
            self._next_refresh = now + self.refresh_interval
            self._update(self._train_task, self._count, trainer)

    def on_train_epoch_end(self, trainer: Trainer, module: TrainModule) -> None:
        if not self._train_active:
            return
        self._train_active = False
        if self._train_task is not None:
            self._update(self._train_task, self._count, trainer)
        elif not self._live:
            elapsed = max(time.monotonic() - self._epoch_start, 1e-9)
            rank_zero_info(f"{self._epoch_description(trainer)}: {self._count} batches, {self._count / elapsed:.2f}it/s "
                           f"{_format_metrics(trainer.progress_bar_metrics)}".rstrip())

    @staticmethod
    def _epoch_description(trainer: Trainer) -> str:
        max_epochs = trainer.max_epochs
        if max_epochs is None or max_epochs < 0:
            return f"Epoch {trainer.current_epoch}"
        return f"Epoch {trainer.current_epoch}/{max_epochs - 1}"

    # -- evaluation (validation inside fit, validate, test, predict) ----------------------
    def _eval_start(self, trainer: Trainer, description: str, batches: str) -> None:
        """A bar for an evaluation; ``batches``: the Trainer's per-loader count of its batches
        (``num_val_batches``, ...), read only when a bar is drawn."""
        if not self._start(trainer):
            return
        self._eval_active = True
        self._eval_count = 0
        self._eval_start_time = time.monotonic()
        self._next_refresh = self._eval_start_time + self.refresh_interval
        if self._progress is not None:
            per_loader = getattr(trainer, batches)
            total = sum(per_loader) if per_loader else None
            total = int(total) if total is not None and total != float("inf") else None
            self._eval_task = self._progress.add_task(description, total=total, metrics="", rate=None)

    def _eval_batch_end(self, trainer: Trainer) -> None:
        if not self._eval_active:
            return
        self._eval_count += 1
        if self._eval_task is None:
            return
        now = time.monotonic()
        if now >= self._next_refresh:
            self._next_refresh = now + self.refresh_interval
            self._update(self._eval_task, self._eval_count, trainer, metrics=False)

    def _eval_end(self, trainer: Trainer, description: str, transient: bool) -> None:
        if not self._eval_active:
            return
        self._eval_active = False
        if self._eval_task is not None:
            if transient:  # validation inside fit: its metrics appear on the training bar
                assert self._progress is not None, "a task is only drawn while the display is up"
                self._progress.remove_task(self._eval_task)
            else:
                self._update(self._eval_task, self._eval_count, trainer, stage=True)
            self._eval_task = None
            if self._train_task is not None:
                self._update(self._train_task, self._count, trainer)
            if not self._in_fit:  # a stand-alone evaluation: the bar is done before its results table
                self._stop()
        elif not self._live and not transient:
            rank_zero_info(f"{description}: {self._eval_count} batches "
                           f"{_format_metrics(trainer.metrics.stage_progress_bar_metrics())}".rstrip())

    def on_sanity_check_start(self, trainer: Trainer, module: TrainModule) -> None:
        self._eval_start(trainer, "Sanity check", "num_sanity_val_batches")

    def on_sanity_check_end(self, trainer: Trainer, module: TrainModule) -> None:
        self._eval_end(trainer, "Sanity check", transient=True)

    def on_validation_start(self, trainer: Trainer, module: TrainModule) -> None:
        if not trainer.sanity_checking:  # the sanity check has its own bar
            self._eval_start(trainer, "Validation", "num_val_batches")

    def on_validation_batch_end(self, trainer: Trainer, module: TrainModule, outputs: Any,
                                batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_batch_end(trainer)

    def on_validation_end(self, trainer: Trainer, module: TrainModule) -> None:
        if not trainer.sanity_checking:
            # Inside fit the metrics show on the training bar (or in the epoch's line).
            self._eval_end(trainer, "Validation", transient=self._in_fit)

    def on_test_start(self, trainer: Trainer, module: TrainModule) -> None:
        self._eval_start(trainer, "Testing", "num_test_batches")

    def on_test_batch_end(self, trainer: Trainer, module: TrainModule, outputs: Any,
                          batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_batch_end(trainer)

    def on_test_end(self, trainer: Trainer, module: TrainModule) -> None:
        self._eval_end(trainer, "Testing", transient=False)

    def on_predict_start(self, trainer: Trainer, module: TrainModule) -> None:
        self._eval_start(trainer, "Predicting", "num_predict_batches")

    def on_predict_batch_end(self, trainer: Trainer, module: TrainModule, outputs: Any,
                             batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_batch_end(trainer)

    def on_predict_end(self, trainer: Trainer, module: TrainModule) -> None:
        self._eval_end(trainer, "Predicting", transient=False)

    # -- drawing ----------------------------------------------------------------------------
    def _update(self, task: TaskID, completed: int, trainer: Trainer, metrics: bool = True, stage: bool = False) -> None:
        """Redraw ``task`` with its rate since it started; with ``metrics``, the training bar's
        (or, with ``stage``, only the running stage's) progress-bar values beside it."""
        assert self._progress is not None, "a task is only drawn while the display is up"
        started = self._epoch_start if task == self._train_task else self._eval_start_time
        fields: dict[str, Any] = {"rate": completed / max(time.monotonic() - started, 1e-9)}
        if metrics:
            fields["metrics"] = _format_metrics(trainer.metrics.stage_progress_bar_metrics() if stage
                                                else trainer.progress_bar_metrics)
        self._progress.update(task, completed=completed, **fields)
        self._progress.refresh()


def _make_progress(console: Console) -> Progress:
    """A rich ``Progress`` that only redraws when asked (``auto_refresh=False``)."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        ProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.table import Column
    from rich.text import Text

    class SpeedColumn(ProgressColumn):
        def render(self, task: Task) -> Text:  # batches over the bar's time so far (rich's own needs 2 redraws)
            speed = task.fields.get("rate")
            return Text(f"{speed:.2f}it/s" if speed else "-- it/s", style="progress.data.speed")

    def whole(**options: Any) -> Column:  # never cut: rich squeezes the ratio columns first
        return Column(no_wrap=True, **options)

    return Progress(
        TextColumn("[progress.description]{task.description}", table_column=whole()),
        BarColumn(bar_width=None, table_column=Column(ratio=1, min_width=5, max_width=30, no_wrap=True)),
        MofNCompleteColumn(table_column=whole()),
        TimeElapsedColumn(table_column=whole()),
        TextColumn("<", table_column=whole()),
        TimeRemainingColumn(table_column=whole()),
        SpeedColumn(table_column=whole()),
        TextColumn("{task.fields[metrics]}", table_column=Column(ratio=3, min_width=0, no_wrap=True, overflow="ellipsis")),
        console=console,
        auto_refresh=False,
        expand=True,
    )
