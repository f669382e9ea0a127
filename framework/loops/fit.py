"""``run_fit``: the sanity check, then training epochs until a limit or a stop request.

A fit ends when ``max_steps`` optimizer steps are taken, ``max_epochs`` epochs are done, or a
stop was requested (a callback's ``trainer.should_stop``, ``max_time``) once ``min_epochs`` have
run. Why it ended is kept in ``trainer.state.stop_reason``.
"""

from __future__ import annotations

from collections.abc import Sized
from typing import TYPE_CHECKING

from framework.errors import ConfigError, TrainingError
from framework.intervals import every
from framework.loops.batches import num_batches
from framework.loops.evaluation import run_evaluation
from framework.loops.training_epoch import run_train_epoch, stop_asked
from framework.module.manual_optimization import ManualOptimization, check_manual_settings
from framework.rank_zero import rank_zero_warn
from framework.seed import isolated_rng

if TYPE_CHECKING:
    from framework.module import TrainModule
    from framework.trainer.run import Run


def run_fit(run: Run) -> None:
    state, hooks = run.state, run.hooks
    train_loaders = run.loaders.get("train") or []
    if not train_loaders:
        raise ConfigError("fit needs training data: pass train_dataloaders= or a datamodule with train_dataloader()")
    loader = train_loaders[0]
    if not run.module.automatic_optimization:
        check_manual_settings(run)
        run.manual = ManualOptimization(run)
    run.num_training_batches = num_batches(loader, run.settings.limits["train"])
    _check_there_is_something_to_train(run, loader)
    hooks("on_fit_start")
    if run.settings.num_sanity_val_steps != 0 and run.loaders.get("validate"):  # also on resume, as in Lightning
        state.stage = "sanity_check"
        hooks.callbacks("on_sanity_check_start")
        sanity = run.settings.num_sanity_val_steps
        with isolated_rng():  # the sanity check leaves the random streams as it found them, as in Lightning
            run_evaluation(run, "validate", limit=None if sanity < 0 else sanity, log=False)  # -1: all
        hooks.callbacks("on_sanity_check_end")
        state.stage = "train"
    if state.position.resume_from is not None:
        state.position.resume_from.restore_rng()
    if run.num_training_batches == 0:  # limit_train_batches=0: the sanity check alone, as in Lightning
        state.stop("no_training_batches")
        hooks("on_fit_end")
        return
    run.fit_batches = run.num_training_batches
    _warn_if_modules_in_eval_mode(run.module)
    hooks("on_train_start")
    stops, source = run.stop_check, run.loader_source
    assert stops is not None and source is not None, "a fit's Run has both (Trainer._run_here, setup.setup)"
    stops.start_clock()
    reload_every = run.settings.reload_dataloaders_every_n_epochs
    while not _fit_done(run):
        if state.epoch > 0 and every(reload_every, state.epoch):
            source.reload(run.loaders)
            loader = run.loaders["train"][0]
            run.num_training_batches = run.fit_batches = num_batches(loader, run.settings.limits["train"])
        with hooks.profiled("run_training_epoch"):
            run_train_epoch(run, loader, stops)
        stops()
    stops.finish()
    hooks("on_train_end")
    hooks("on_fit_end")


def _warn_if_modules_in_eval_mode(module: TrainModule) -> None:
    """fw, as Lightning, trains the module in the modes it has (a frozen part may stay in eval
    mode), and says so once, as Lightning does, when some part is in eval mode at the start."""
    in_eval = [name or type(module).__name__ for name, m in module.named_modules() if not m.training]
    if in_eval:
        rank_zero_warn(f"{len(in_eval)} module(s) in eval mode at the start of training ({', '.join(in_eval[:3])}"
                       f"{', ...' if len(in_eval) > 3 else ''}): they train in eval mode (dropout off, batch-norm "
                       "statistics frozen); call .train() on them before fit if that is not intended")


def _check_there_is_something_to_train(run: Run, loader) -> None:
    if num_batches(loader, None) == 0:
        dataset = getattr(loader, "dataset", None)
        size = f" ({len(dataset)} samples" if isinstance(dataset, Sized) else " ("
        raise TrainingError(
            f"the training data has no batches{size}, batch_size {getattr(loader, 'batch_size', '?')}"
            f"{', drop_last' if getattr(loader, 'drop_last', False) else ''} on {run.strategy.world_size} rank(s)): "
            "check the data set and the batch size"
        )
    if run.num_training_batches == 0:
        rank_zero_warn(f"trainer.limit_train_batches={run.settings.limits['train']!r} leaves 0 training batches: "
                       "fit runs the sanity check alone and trains nothing, as in Lightning; raise it to train")


def _fit_done(run: Run) -> bool:
    state = run.state
    if run.settings.max_steps >= 0 and state.global_step >= run.settings.max_steps:
        state.stop("max_steps")
        return True
    if run.settings.max_epochs >= 0 and state.epoch >= run.settings.max_epochs:
        state.stop("max_epochs")
        return True
    if state.stop_reason == "preempted":
        return True
    if stop_asked(run):  # under ``ft``, as the replica groups agreed
        state.stop("should_stop")
        return True
    return False
