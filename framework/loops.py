"""The loops: fit (train + periodic validation), evaluation (validate/test) and predict.

The training step reads top to bottom: move the batch, run ``training_step`` (under autocast,
without gradient sync on accumulation steps), backward, and every ``accumulate_grad_batches``
batches: unscale, clip, step, zero the gradients, step schedulers. Nothing in the per-batch path
calls ``.item()`` or allocates hook lists; hooks nobody overrides are skipped.
"""

from __future__ import annotations

import contextlib
import math
import time
from typing import Any

import torch

from framework import trainer_state
from framework.data import set_sampler_epoch
from framework.errors import ConfigError
from framework.eval_loop import call_hook, log_epoch_metrics, num_batches, run_evaluation
from framework.hooks import overrides
from framework.module import TrainModule
from framework.results import MetricCollector
from framework.seed import get_rng_state, set_rng_state


# -- fit ----------------------------------------------------------------------------------------
def run_fit(trainer, stage: str, checkpoint: dict | None) -> None:
    train_loaders = trainer._loaders.get("train") or []
    if not train_loaders:
        raise ConfigError("fit needs training data: pass train_dataloaders= or a datamodule with train_dataloader()")
    loader = train_loaders[0]
    trainer.num_training_batches = num_batches(loader, trainer.limits["train"])
    trainer_state.print_summary(trainer, "fit", getattr(loader, "batch_size", None))
    call_hook(trainer, "on_fit_start")
    if checkpoint is None and trainer.num_sanity_val_steps > 0 and trainer._loaders.get("validate"):
        trainer.sanity_checking = True
        trainer._hooks("on_sanity_check_start")
        run_evaluation(trainer, "validate", limit=trainer.num_sanity_val_steps, log=False)
        trainer._hooks("on_sanity_check_end")
        trainer.sanity_checking = False
    trainer_state.restore_rng(trainer, checkpoint)
    trainer.training = True
    call_hook(trainer, "on_train_start")
    deadline = time.monotonic() + trainer.max_time if trainer.max_time else None
    while not _fit_done(trainer):
        run_train_epoch(trainer, loader, deadline)
        if deadline is not None and _time_is_up(trainer, deadline):
            trainer.should_stop = True
    trainer.training = False
    call_hook(trainer, "on_train_end")
    call_hook(trainer, "on_fit_end")


def _time_is_up(trainer, deadline: float) -> bool:
    """Has max_time passed on any rank? (Collective when distributed: call on every rank.)"""
    return trainer.strategy.reduce_boolean_decision(time.monotonic() > deadline, all=False)


def _fit_done(trainer) -> bool:
    if trainer.max_steps >= 0 and trainer.global_step >= trainer.max_steps:
        return True
    if trainer.max_epochs >= 0 and trainer.current_epoch >= trainer.max_epochs:
        return True
    return trainer.should_stop and trainer.current_epoch >= trainer.min_epochs


def run_train_epoch(trainer, loader, deadline: float | None) -> None:
    module, strategy, precision = trainer.module, trainer.strategy, trainer.precision
    epoch = trainer.current_epoch
    collector = trainer._collector = MetricCollector("train", trainer._current_batch_size)
    module.train()
    set_sampler_epoch(loader, epoch)
    call_hook(trainer, "on_train_epoch_start")
    trainer._epoch_start_rng = get_rng_state()
    trainer._loop_position = {"epoch": epoch, "batches_done": 0, "epoch_finished": False}
    iterator = iter(loader)
    start = _skip_done_batches(trainer, iterator)
    limit = trainer.num_training_batches
    lookahead = None
    if math.isinf(limit):  # no length: read one batch ahead to know which batch is the last
        iterator = lookahead = _LookAhead(iterator)

    accumulate = trainer.accumulate_grad_batches
    val_every = _val_check_batches(trainer, limit)
    to_device, device = trainer.accelerator.batch_to_device, strategy.root_device
    # everything per-batch is looked up once per epoch; hooks nobody overrides are None
    step_fn = strategy.training_step_fn(module)
    batch_start = _hook_fn(trainer, "on_train_batch_start")
    batch_end = _hook_fn(trainer, "on_train_batch_end")
    before_backward = _hook_fn(trainer, "on_before_backward")
    after_backward = _hook_fn(trainer, "on_after_backward")
    before_step = _hook_fn(trainer, "on_before_optimizer_step")
    no_sync = strategy.no_sync if strategy.multi_process and accumulate > 1 else None
    autocast = precision.autocast if precision.autocast_dtype is not None else None
    backward = precision.backward if precision.scaler is not None else torch.Tensor.backward
    plain_step = precision.scaler is None and not trainer.gradient_clip_val
    step_schedulers = any(cfg.interval == "step" for cfg in trainer.lr_scheduler_configs)
    log_every = trainer.log_every_n_steps
    optimizers = trainer.optimizers
    position = trainer._loop_position
    # ranks must stop at the same batch: when distributed, the clock is read jointly (a
    # collective), so only every 20 batches
    time_check_every = 20 if strategy.is_distributed else 1

    for batch_idx, batch in enumerate(iterator, start):
        if batch_idx >= limit:
            break
        batch = to_device(batch, device)
        trainer._current_batch = batch
        if batch_start is not None:
            batch_start(batch, batch_idx)
        steps_now = (batch_idx + 1) % accumulate == 0 or batch_idx + 1 == limit or (
            lookahead is not None and lookahead.last)

        # forward and backward (no gradient all-reduce on accumulation steps)
        with no_sync() if no_sync is not None and not steps_now else _NO_CONTEXT:
            with autocast() if autocast is not None else _NO_CONTEXT:
                outputs = step_fn(batch, batch_idx)
            loss = outputs["loss"] if isinstance(outputs, dict) else outputs
            if loss is not None:  # None: the step chose to skip this batch
                if accumulate > 1:
                    loss = loss / accumulate
                if before_backward is not None:
                    before_backward(loss)
                backward(loss)
                if after_backward is not None:
                    after_backward()

        # optimizer step every `accumulate` batches
        if steps_now:
            for opt in optimizers:
                if plain_step:
                    if before_step is not None:
                        before_step(opt)
                    opt.step()
                else:
                    precision.unscale(opt)  # hooks and clipping see the true gradients
                    if before_step is not None:
                        before_step(opt)
                    _clip_and_step(trainer, opt)
                opt.zero_grad(set_to_none=True)
            trainer.global_step += 1
            if step_schedulers:
                _step_schedulers(trainer, "step")
            if trainer.global_step % log_every == 0 and collector.step_dirty and trainer.loggers:
                _log_step_metrics(trainer, collector)
        position["batches_done"] = batch_idx + 1
        if batch_end is not None:
            batch_end(outputs, batch, batch_idx)

        if val_every and (batch_idx + 1) % val_every == 0 and batch_idx + 1 < limit and _val_due(trainer, True):
            run_evaluation(trainer, "validate")
            module.train()
        if trainer.should_stop and trainer.current_epoch + 1 >= trainer.min_epochs:
            break
        if trainer.max_steps >= 0 and trainer.global_step >= trainer.max_steps:
            break
        if deadline is not None and (batch_idx + 1) % time_check_every == 0 and _time_is_up(trainer, deadline):
            trainer.should_stop = True
            break
    _end_train_epoch(trainer, collector)


_NO_CONTEXT = contextlib.nullcontext()


class _LookAhead:
    """An iterator that knows, after each item, whether it was the last (``.last``)."""

    _END = object()

    def __init__(self, iterator) -> None:
        self._iterator, self.last = iterator, False
        self._next = next(iterator, self._END)

    def __iter__(self):
        return self

    def __next__(self):
        item = self._next
        if item is self._END:
            raise StopIteration
        self._next = next(self._iterator, self._END)
        self.last = self._next is self._END
        return item


def _clip_and_step(trainer, optimizer) -> None:
    if trainer.gradient_clip_val:
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if trainer.gradient_clip_algorithm == "norm":
            torch.nn.utils.clip_grad_norm_(params, trainer.gradient_clip_val)
        else:
            torch.nn.utils.clip_grad_value_(params, trainer.gradient_clip_val)
    trainer.precision.step(optimizer)


def _end_train_epoch(trainer, collector) -> None:
    if _val_due(trainer, False) and trainer._loaders.get("validate") and not _stopped_early_by_steps(trainer):
        run_evaluation(trainer, "validate")
    call_hook(trainer, "on_train_epoch_end", callbacks=False)
    values = collector.compute_epoch(trainer.strategy, trainer.module)
    trainer._epoch_metrics.update(values)
    trainer._prog_bar_keys.update({k: f[0] for k, f in collector.epoch_flags.items()})
    if collector.step_dirty and trainer.loggers:
        _log_step_metrics(trainer, collector)
    log_epoch_metrics(trainer, collector)
    _step_schedulers(trainer, "epoch")
    trainer._loop_position["epoch_finished"] = True
    trainer._hooks("on_train_epoch_end")
    trainer.current_epoch += 1


def _stopped_early_by_steps(trainer) -> bool:
    """Lightning validates at max_steps only at an epoch's natural end; mid-epoch stops skip it."""
    done = trainer._loop_position["batches_done"]
    return trainer.max_steps >= 0 and trainer.global_step >= trainer.max_steps and done < trainer.num_training_batches


def _skip_done_batches(trainer, iterator) -> int:
    """On a mid-epoch resume, draw the batches already trained on (same order), then restore
    the RNG state the checkpoint had at that point."""
    resume = getattr(trainer, "_resume", None)
    if not resume or not resume.get("batches_done"):
        return 0
    done = resume["batches_done"]
    for _ in range(done):
        next(iterator)
    if "rng_after_skip" in resume:
        set_rng_state(resume["rng_after_skip"])
    trainer._resume = None
    trainer._loop_position["batches_done"] = done
    return done


def _step_schedulers(trainer, interval: str) -> None:
    count = trainer.global_step if interval == "step" else trainer.current_epoch + 1
    for cfg in trainer.lr_scheduler_configs:
        if cfg.interval != interval or count % cfg.frequency:
            continue
        if isinstance(cfg.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            monitor = cfg.monitor or "val_loss"
            metrics = trainer.callback_metrics
            if monitor not in metrics:
                if cfg.strict:
                    raise ConfigError(
                        f"lr_scheduler monitor '{monitor}' was not logged; logged: {', '.join(sorted(metrics)) or 'none'}"
                    )
                continue
            cfg.scheduler.step(float(metrics[monitor]))
        else:
            cfg.scheduler.step()


def _val_check_batches(trainer, limit: float) -> int | None:
    interval = trainer.val_check_interval
    if interval is None or not trainer._loaders.get("validate"):
        return None
    if isinstance(interval, float):
        if math.isinf(limit):
            raise ConfigError("trainer.val_check_interval as a fraction needs a loader with a length")
        return max(1, int(limit * interval))
    return int(interval)


def _val_due(trainer, mid_epoch: bool) -> bool:
    """``check_val_every_n_epoch=None`` validates only every ``val_check_interval`` batches."""
    n = trainer.check_val_every_n_epoch
    if n is None:
        return mid_epoch
    return (trainer.current_epoch + 1) % n == 0

def _hook_fn(trainer, name: str):
    """One callable for a per-batch hook (module + callbacks), or None when nobody overrides it."""
    module, hooks = trainer.module, trainer._hooks
    module_fn = getattr(module, name) if overrides(module, TrainModule, name) else None
    if module_fn is None and not hooks.has(name):
        return None
    if not hooks.has(name):
        return module_fn

    def call(*args: Any) -> None:  # callbacks first, then the module, as Lightning does
        hooks(name, *args)
        if module_fn is not None:
            module_fn(*args)

    return call



def _log_step_metrics(trainer, collector) -> None:
    metrics = {k: float(v) for k, v in collector.step_values_for("logger").items()}
    collector.step_dirty = False
    if metrics:
        trainer.log_metrics({**metrics, "epoch": trainer.current_epoch}, trainer.global_step)
