"""One training epoch: batches (``training_step.py``: one batch of automatic optimization),
validation every ``val_check_interval`` batches, and the epoch's end.

Gradient accumulation: ``accumulate_grad_batches = k`` runs forward/backward on every batch and
steps the optimizers on every k-th batch, on the epoch's last batch (even when its group is
short), and, for loaders without a length, on the batch a look-ahead shows to be the last.

The loop stops early when ``max_steps`` is reached, when a stop was requested once
``min_epochs`` are done, when ``max_time`` has passed, or when a rank received a stop signal
(both read jointly by all ranks when distributed, so that they stop at the same batch: see
``StopCheck``). Such a cut epoch still ends (its
epoch-end hooks run and it counts in ``current_epoch``, as in Lightning), but ``trainer.state``
records it as unfinished: epoch-interval schedulers do not step for it, and a checkpoint written
from then on resumes at its next batch, with its running metric aggregates and RNG state.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from framework.data import set_sampler_epoch
from framework.errors import ConfigError, TrainingError
from framework.intervals import every
from framework.loops.batches import LookAhead, up_to
from framework.loops.evaluation import log_epoch_metrics, log_row, run_evaluation
from framework.loops.forward_only import forward_only_step_fn
from framework.loops.nonfinite import nonfinite_guard
from framework.loops.schedulers import step_schedulers
from framework.loops.training_step import automatic_step_fn
from framework.loops.transfer import batch_transfer_fn
from framework.profilers.timing import TRAIN_NEXT

if TYPE_CHECKING:
    from framework.run_state.metric_collector import MetricCollector
    from framework.run_state.state import RunState
    from framework.trainer.preemption import StopCheck
    from framework.trainer.run import Run


def run_train_epoch(run: Run, loader, stops: StopCheck) -> None:  # noqa: C901 (the epoch reads top to bottom, as Lightning's)
    state, hooks = run.state, run.hooks
    collector = _begin_epoch(run, loader)
    position, limit = state.position, run.num_training_batches
    position.start(state.epoch)
    iterator, start = position.continue_epoch(loader, collector, run.module)
    iterator = hooks.fetching(up_to(iterator, limit - start), TRAIN_NEXT, limit - start)
    lookahead = None
    if math.isinf(limit):  # no length: read one batch ahead to know which batch is the last
        iterator = lookahead = LookAhead(iterator)

    # everything per batch is looked up once per epoch
    manual = run.manual is not None  # the module steps its optimizers itself (module/manual_optimization.py)
    train_batch, flush_checks = _batch_step(run)
    batch_start, batch_end = hooks.per_batch("on_train_batch_start"), hooks.per_batch("on_train_batch_end")
    to_device = batch_transfer_fn(run, 0)
    accumulate, val_every = run.settings.accumulate_grad_batches, _val_check_batches(run, limit)
    schedulers, metrics = bool(run.lr_scheduler_configs), run.metrics
    replicas = run.strategy.replicas  # ``ft``: the replica groups (strategies/ft/replicas.py)

    # batches whose training_step returned a loss; on_train_batch_start gave -1; the last batch validated after
    trained, rest_skipped, validated_after = 0, False, -1
    for batch_idx, batch in enumerate(iterator, start):
        if batch_idx >= limit:
            break
        batch = metrics.current_batch = to_device(batch) if to_device is not None else batch
        state.batch_idx, state.log_due = batch_idx, False
        state.is_last_batch = last = batch_idx + 1 == limit or (lookahead is not None and lookahead.last)
        if batch_start is not None and batch_start(batch, batch_idx) == -1:
            rest_skipped = True  # Lightning: the rest of the epoch is skipped, and the epoch counts as done;
            if schedulers:       # its schedulers step as after a batch that stepped
                step_schedulers(run, "step", plateau=False, batch_idx=batch_idx)
                step_schedulers(run, "epoch", plateau=False)
            break
        steps_now = accumulate == 1 or last or every(accumulate, batch_idx + 1)
        outputs = train_batch(batch, batch_idx, steps_now)
        if outputs is not None or manual:
            trained += 1
        _count_the_step(run, batch_idx, manual or steps_now, manual, schedulers)  # manual: every batch counts
        if last and schedulers:
            step_schedulers(run, "epoch", plateau=False)
        position.batches = batch_idx + 1
        if batch_end is not None:
            batch_end(_handed_on(outputs, 1 if manual else accumulate), batch, batch_idx)
        if state.log_due and collector.step_dirty and run.loggers:  # after on_train_batch_end, as in Lightning
            _log_step_metrics(run, collector)
        if val_every and batch_idx + 1 < limit and _val_due(run, batch_idx, limit, val_every):
            run_evaluation(run, "validate", zero_grad=steps_now)
            validated_after = batch_idx
        if schedulers and steps_now:
            step_schedulers(run, "step", plateau=True, batch_idx=batch_idx)
        stopping = _stops_here(run, stops, batch_idx)
        if replicas is not None and (stopping or (last and _last_epoch(run))) and state.stop_reason not in _ALONE:
            replicas.last_quorum(state.epoch, position.batches, state.global_step)  # ``ft``: one behind catches up
        if stopping:
            break
    flush_checks()
    if not trained and not rest_skipped:
        _refuse_an_epoch_that_trained_nothing(state, start)
    at_end = position.batches >= limit if lookahead is None else lookahead.last or not position.batches
    if not at_end and position.batches and not rest_skipped:  # a stop cut the epoch short: a resume continues it
        position.cut_short(collector.state_dict(run.module))
    _end_train_epoch(run, collector, validate=not rest_skipped and validated_after != position.batches - 1)


#: stops that one ``ft`` replica group takes alone (its own clock, a signal to its ranks): it leaves as a lost one
_ALONE = ("preempted", "max_time")


def stop_asked(run: Run) -> bool:
    """``trainer.should_stop`` is taken now: once ``min_epochs`` epochs and ``min_steps`` steps are
    done (Lightning's rule). Under ``ft`` a stop asked for on one replica group is taken when the
    replicas agreed on it, at the next step's commit (``Replicas.commit``), so that every replica
    stops after the same step; asked for at an epoch's end, after the next epoch's first step."""
    state, replicas = run.state, run.strategy.replicas
    asked = state.should_stop if replicas is None else replicas.stop_agreed
    return asked and run.settings.may_stop(state)


def _last_epoch(run: Run) -> bool:
    return 0 <= run.settings.max_epochs <= run.state.epoch + 1


def _stops_here(run: Run, stops: StopCheck, batch_idx: int) -> bool:
    """After a batch: a stop asked for (by a callback, max_time: ``stop_asked``), ``max_steps``
    reached, or a stop signal on any rank (at once)."""
    state, settings = run.state, run.settings
    if stop_asked(run):
        return True
    if settings.max_steps >= 0 and state.global_step >= settings.max_steps:
        return True
    return stops.after_batch(batch_idx) and (state.stop_reason == "preempted" or settings.may_stop(state))


def _begin_epoch(run: Run, loader) -> MetricCollector:
    """The epoch's metrics, its sampler epoch, and ``on_train_epoch_start`` between the counts
    of Lightning's ``epoch_progress`` (ready before it, started after)."""
    state = run.state
    collector = run.metrics.new_epoch("train")
    set_sampler_epoch(loader, state.epoch)
    state.epoch_phase = 1
    run.hooks("on_train_epoch_start")
    state.epoch_phase = 2
    return collector


def _batch_step(run: Run) -> tuple[Callable[[Any, int, bool], Any], Callable[[], None]]:
    """``(batch, batch_idx, steps_now) -> outputs`` (timed as Lightning's ``run_training_batch``),
    and what reads the pending loss checks."""
    if run.state.forward_only:  # training_step alone (StochasticWeightAveraging's BatchNorm epoch)
        step, flush = forward_only_step_fn(run), _no_checks
    elif run.manual is not None:
        guard = nonfinite_guard(run)
        step, flush = run.manual.step_fn(guard), guard.flush
    else:
        step, flush = automatic_step_fn(run)
    return run.hooks.timed("run_training_batch", step), flush


def _no_checks() -> None:
    pass


def _refuse_an_epoch_that_trained_nothing(state: RunState, start: int) -> None:
    """An epoch whose batches all returned None from training_step trained nothing: an error."""
    if state.position.batches > start:
        raise TrainingError(
            f"training_step returned None for all {state.position.batches - start} batches of epoch {state.epoch}: "
            "nothing was trained. Return the loss (a tensor) or a dict with 'loss'; None skips one batch"
        )


def _count_the_step(run: Run, batch_idx: int, stepped: bool, manual: bool, schedulers: bool) -> None:
    """A batch that stepped (in manual optimization every batch, as in Lightning): the step
    count, step-interval schedulers, and whether a row of step values is due (every
    ``log_every_n_steps``: ``log_due``). A batch that only accumulated is remembered: a
    validation after it logs at the count so far (``RunState.logger_step``)."""
    state = run.state
    if not stepped:
        state.uncounted_batch = (state.epoch, batch_idx)
        return
    if state.forward_only:  # no optimizer step ran
        return
    if not manual:
        state.global_step += 1
        if schedulers:
            step_schedulers(run, "step", plateau=False, batch_idx=batch_idx)
    state.batches_that_stepped += 1
    n = run.settings.log_every_n_steps  # 0: no step rows at all, as in Lightning
    state.log_due = n > 0 and (every(n, state.batches_that_stepped) or state.should_stop)


def _handed_on(outputs: Any, accumulate: int) -> Any:
    """What ``on_train_batch_end`` gets, as in Lightning: a dict whose ``loss`` is detached (and
    divided for accumulation, as it was for the backward); ``{}`` for a skipped batch; anything
    else (a manual step's own outputs) as it is."""
    if outputs is None:
        return {}
    if isinstance(outputs, torch.Tensor):
        return {"loss": _as_backward_saw_it(outputs, accumulate)}
    if isinstance(outputs, dict) and isinstance(outputs.get("loss"), torch.Tensor):
        return {**outputs, "loss": _as_backward_saw_it(outputs["loss"], accumulate)}
    return dict(outputs) if isinstance(outputs, dict) else outputs


def _as_backward_saw_it(loss: torch.Tensor, accumulate: int) -> torch.Tensor:
    return loss.detach() / accumulate if accumulate > 1 else loss.detach()


def _end_train_epoch(run: Run, collector: MetricCollector, validate: bool) -> None:
    """Validation, then the epoch-end hooks (``hooks.train_epoch_end``'s order), each seeing this
    epoch's values in ``callback_metrics``; ReduceLROnPlateau steps before the monitoring
    callbacks (ModelCheckpoint), so a checkpoint written there resumes exactly."""
    state, hooks, strategy, module = run.state, run.hooks, run.strategy, run.module
    position = state.position
    if position.validated_values is not None:  # resumed from a checkpoint written at the end of this validation
        run.metrics.restore(position.validated_values)
        position.validated, position.validated_values = True, None
    elif (validate and run.loaders.get("validate") and (_val_due_at_epoch_end(run) or _stops_early(run))
            and not _stopped_early_by_steps(run) and state.stop_reason != "preempted"):  # no time for it
        run_evaluation(run, "validate", zero_grad=True, epoch_end=True)
    state.epoch_phase = 3
    collector.compute_epoch(strategy, module, final=False, hooks_may_log=hooks.epoch_end_may_log("on_train_epoch_end"))
    run.metrics.record_epoch(collector)
    hooks.train_epoch_end(monitoring=False)
    collector.compute_epoch(strategy, module, final=True)  # what the hooks logged
    run.metrics.record_epoch(collector)
    log_epoch_metrics(run, collector)  # step rows only every log_every_n_steps, as in Lightning
    if state.position.cut is None:  # epoch-interval schedulers step for finished epochs only
        step_schedulers(run, "epoch", plateau=True)
        state.position.finished = True  # its epoch-end hooks still see ``epoch``
    hooks.train_epoch_end(monitoring=True)
    state.advance_epoch()


def _stops_early(run: Run) -> bool:
    """Lightning validates after the batch at which a stop was asked for (``trainer.should_stop``,
    once it may stop), in an epoch that validates (the caller skips it where a validation has
    just run after that batch)."""
    settings = run.settings
    return stop_asked(run) and (
        settings.check_val_every_n_epoch is None or every(settings.check_val_every_n_epoch, run.state.epoch + 1))


def _stopped_early_by_steps(run: Run) -> bool:
    """Lightning validates at max_steps only at an epoch's natural end; mid-epoch stops skip it."""
    done = run.state.position.batches
    return run.settings.max_steps >= 0 and run.state.global_step >= run.settings.max_steps and done < run.num_training_batches


def _val_check_batches(run: Run, limit: float) -> int | None:
    interval = run.settings.val_check_interval
    if interval is None or not run.loaders.get("validate"):
        return None
    if isinstance(interval, int) and interval > limit and run.settings.check_val_every_n_epoch is not None:
        raise ConfigError(  # Lightning's rule
            f"trainer.val_check_interval={interval} is more than the {int(limit)} training batches of an epoch, so "
            "it would never validate: give at most that many, set check_val_every_n_epoch=null to count batches "
            "across epochs, or limit_val_batches=0 to skip validation")
    if isinstance(interval, float):
        if math.isinf(limit):
            raise ConfigError("trainer.val_check_interval as a fraction needs a loader with a length")
        return max(1, int(limit * interval))
    return int(interval)


def _val_due(run: Run, batch_idx: int, limit: float, interval: int) -> bool:
    """Lightning's rule: validate after every ``interval``-th batch of the epoch, or of the whole
    fit with ``check_val_every_n_epoch=None`` (epochs of ``limit`` batches), in the epochs that
    validate."""
    n = run.settings.check_val_every_n_epoch
    if n is None:
        done = run.state.epoch * int(limit) + batch_idx + 1 if not math.isinf(limit) else batch_idx + 1
        return every(interval, done)
    return every(interval, batch_idx + 1) and every(n, run.state.epoch + 1)


def _val_due_at_epoch_end(run: Run) -> bool:
    """At the end of an epoch that validates: always with the default ``val_check_interval``
    (or a loader without a length); with an interval, only if the last batch falls on it, as in
    Lightning (5 batches, every 2: after the 2nd and the 4th, not after the 5th)."""
    limit, done = run.num_training_batches, run.state.position.batches
    interval = _val_check_batches(run, limit)
    if interval is None or math.isinf(limit):
        return every(run.settings.check_val_every_n_epoch, run.state.epoch + 1)
    return _val_due(run, done - 1, limit, interval)


def _log_step_metrics(run: Run, collector: MetricCollector) -> None:
    metrics = {k: float(v) for k, v in collector.step_values_for("logger").items()}
    collector.step_dirty = False
    if metrics:
        log_row(run, metrics)
