"""Checkpoints of a run: what ``save`` writes and how ``restore`` puts it back (where a
resumed fit continues, and which checkpoints it refuses, is ``resume.py`` beside this file).

A checkpoint holds the weights, optimiser and scheduler states, the GradScaler, the run's
progress (``RunState.progress()``, one piece), callback states, hyperparameters and every rank's
RNG states: the current ones and those at the start of the epoch. Resuming in the middle of an
epoch rebuilds that epoch's data order from the epoch-start RNG, draws (and drops) the batches
already trained on, then puts back the RNG state of the moment the checkpoint was written, so
the resumed run is bit for bit the run that was never stopped. That position is counted in
batches per rank, so a mid-epoch checkpoint resumes on the number of ranks (and with the batch
size) it was written with; one written at an epoch end resumes on any number. The file format
(atomic write, safe load) is ``framework/checkpoint.py``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed

from framework import checkpoint as ckpt
from framework.errors import CheckpointError, TrainingError
from framework.rank_zero import rank_zero_info, rank_zero_warn
from framework.seed import get_rng_state
from framework.trainer.resume import check_position_carries_over, resume_point, train_batch_size

if TYPE_CHECKING:
    from framework.trainer.run import Run


# -- save -----------------------------------------------------------------------------------------
def save(run: Run, path) -> None:
    """Gather every rank's RNG state, write on rank 0, then wait for it on every rank.

    Outside a run (after ``fit`` returned, its process group gone) there is nobody to gather
    from or wait for: rank 0 writes its own state.
    """
    strategy = run.strategy
    live = strategy.is_distributed and torch.distributed.is_available() and torch.distributed.is_initialized()
    _refuse_nonfinite_weights(run, path, live)
    state = run.state
    # a cut epoch resumes right after its last batch, whatever its epoch end drew since
    now = state.cut.rng_after_last_batch if state.cut is not None else get_rng_state()
    mine = {"rng": {"now": now, "epoch_start": state.epoch_start_rng}, "metrics": _running_aggregates(run),
            "loader": _loader_state(run)}
    per_rank = strategy.all_gather_object(mine) if live else [mine]
    error: Exception | None = None
    if strategy.is_global_zero:
        try:
            ckpt.atomic_save(dump(run, per_rank), path)
        except Exception as exc:  # disk full, permissions: the other ranks must not wait for it
            error = exc
    # every rank learns whether rank 0's write succeeded (this is also the barrier)
    if live and not strategy.reduce_boolean_decision(error is None, all=True) and error is None:
        raise CheckpointError(f"rank 0 failed to write the checkpoint '{path}'; its own error says why")
    cause = _os_error(error)
    if cause is not None:  # full disk, no permission, a file where a folder should be
        raise CheckpointError(
            f"writing the checkpoint '{path}' failed ({type(cause).__name__}: {cause.strerror or cause}); "
            "earlier checkpoints are intact. Free space or pick a writable folder"
        ) from None
    if error is not None:
        raise error


def _os_error(error: BaseException | None) -> OSError | None:
    """The OSError behind ``error`` (torch.save on a full disk raises its own error while
    handling the OSError), or None."""
    while error is not None and not isinstance(error, OSError):
        error = error.__cause__ or error.__context__
    return error


def _refuse_nonfinite_weights(run: Run, path, live: bool) -> None:
    """Never write NaN or infinite weights (over a good checkpoint, say): every rank checks
    its own, and all refuse together."""
    finite = all(bool(torch.isfinite(p).all()) for p in run.module.parameters() if p.is_floating_point())
    if live:
        finite = run.strategy.reduce_boolean_decision(finite, all=True)
    if not finite:
        raise TrainingError(
            f"the weights are not finite (NaN or inf) at step {run.state.global_step}: the checkpoint "
            f"'{path}' was not written and earlier checkpoints stay as they are. Lower the learning "
            "rate or clip gradients (trainer.gradient_clip_val)"
        )


def dump(run: Run, per_rank: list[dict]) -> dict:
    """The checkpoint's contents; ``per_rank`` holds every rank's RNG states and running metric
    aggregates (each rank has its own)."""
    module = run.module
    checkpoint = {
        "fw_format": ckpt.FORMAT_VERSION,
        "epoch": run.state.epoch,
        "global_step": run.state.global_step,
        "loop": run.state.progress(),
        "state_dict": module.state_dict(),
        "optimizer_states": [opt.state_dict() for opt in run.optimizers],
        "lr_schedulers": [cfg.scheduler.state_dict() for cfg in run.lr_scheduler_configs],
        "precision": run.precision.state_dict(),
        "callbacks": {cb.state_key: cb.state_dict() for cb in run.callbacks},
        "hyper_parameters": ckpt.plain_hparams(getattr(module, "hparams", {}) or {}),
        "rng": [mine["rng"] for mine in per_rank],
        "world_size": run.strategy.world_size,
        "train_batch_size": train_batch_size(run),  # the unit of a mid-epoch position ("loop")
        "metrics": [mine["metrics"] for mine in per_rank],
        "loader_states": [mine["loader"] for mine in per_rank],
        # a restarted (elastic) or requeued (SLURM) job looks for its own checkpoints by these
        "run_id": os.environ.get("TORCHELASTIC_RUN_ID"),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "fit_index": run.state.fit_index,
    }
    datamodule_state = run.datamodule.state_dict() if run.datamodule is not None else None
    if datamodule_state:
        checkpoint[type(run.datamodule).__qualname__] = datamodule_state
    run.hooks.callbacks("on_save_checkpoint", checkpoint)  # the callbacks' hooks, then the module's
    run.hooks.module_hook("on_save_checkpoint", checkpoint)
    return checkpoint


def _loader_state(run: Run) -> dict | None:
    """Mid-epoch, a stateful training loader's own position (its ``state_dict()``)."""
    loaders = run.loaders.get("train") or []
    if not loaders or not run.state.mid_epoch:
        return None
    return loaders[0].state_dict() if callable(getattr(loaders[0], "state_dict", None)) else None


def _running_aggregates(run: Run) -> dict | None:
    """Mid-epoch, the epoch's metric aggregates so far (so a resume logs the same epoch values)."""
    state = run.state
    if not state.mid_epoch:
        return None
    if state.cut is not None:
        return state.cut.metrics
    return run.metrics.training.state_dict(run.module)


# -- restore --------------------------------------------------------------------------------------
def resolve_path(run: Run, ckpt_path: Any) -> str | None:
    """The checkpoint file a run starts from: ``ckpt_path`` itself, the newest ``last*.ckpt``
    for ``"last"``, or, in a restarted or requeued job's fit, its own newest checkpoint."""
    fn = run.fn
    if fn == "fit":
        run.state.fit_index = _count_fit()
    if ckpt_path is None and fn == "fit":
        return _checkpoint_to_restart_from(run)
    if ckpt_path == "best":
        best = run.trainer.checkpoint_callback.best_model_path if run.trainer.checkpoint_callback is not None else ""
        if not best:  # never an older file or the weights in memory: they are not what "best" asked for
            raise CheckpointError("ckpt_path='best': this Trainer's ModelCheckpoint saved no checkpoint (no fit "
                                  "yet, or no save point was reached: with check_val_every_n_epoch != 1 or "
                                  "val_check_interval != 1.0 it saves after validation); fit with it first, or give "
                                  "ckpt_path=PATH")
        return best
    if ckpt_path == "last":
        dirs = [getattr(cb, "dirpath", None) for cb in run.callbacks]
        found = ckpt.find_last_checkpoint(dirs, run.settings.default_root_dir)
        if found is None and fn != "fit":  # scoring fresh weights is never what "last" asked for
            raise CheckpointError(f"ckpt_path='last': no checkpoint under {run.settings.default_root_dir}; fit first, or "
                                  "give ckpt_path=PATH")
        if found is None:
            rank_zero_warn(f"ckpt_path='last': no checkpoint under {run.settings.default_root_dir}; starting fresh "
                           "(give ckpt_path=PATH to resume a checkpoint kept elsewhere)")
        return found
    return None if ckpt_path is None else str(ckpt_path)


def restore(run: Run, ckpt_path: str | None) -> None:
    """Load weights (and for fit, everything else) from ``ckpt_path`` (see ``resolve_path``);
    for fit, leave the point to continue from in ``trainer.state.resume_from``."""
    fn = run.fn
    run.state.ckpt_path = ckpt_path
    if ckpt_path is None:
        return
    checkpoint = ckpt.load_checkpoint(ckpt_path)
    if fn == "fit":  # before anything is loaded: a refused resume leaves the model as it was
        check_position_carries_over(run, checkpoint, ckpt_path)
    rank_zero_info(f"fw {fn}: loaded {ckpt_path} (step {checkpoint.get('global_step')})")
    module = run.module
    run.hooks.module_hook("on_load_checkpoint", checkpoint)
    try:
        module.load_state_dict(checkpoint["state_dict"])
    except RuntimeError as err:
        raise CheckpointError(f"checkpoint '{ckpt_path}' does not fit this model: {ckpt.state_dict_mismatch(err)}") from None
    datamodule = run.datamodule
    if datamodule is not None and type(datamodule).__qualname__ in checkpoint:
        datamodule.load_state_dict(checkpoint[type(datamodule).__qualname__])
    if fn != "fit":
        return
    _check_count(ckpt_path, "optimizer", checkpoint["optimizer_states"], run.optimizers)
    _check_count(ckpt_path, "LR scheduler", checkpoint["lr_schedulers"], run.lr_scheduler_configs)
    for opt, state in zip(run.optimizers, checkpoint["optimizer_states"], strict=True):
        opt.load_state_dict(state)
    for cfg, state in zip(run.lr_scheduler_configs, checkpoint["lr_schedulers"], strict=True):
        cfg.scheduler.load_state_dict(state)
    run.precision.load_state_dict(checkpoint.get("precision", {}))
    run.hooks.callbacks("on_load_checkpoint", checkpoint)  # then each callback's state, as in Lightning
    for cb in run.callbacks:
        if checkpoint.get("callbacks", {}).get(cb.state_key):
            cb.load_state_dict(checkpoint["callbacks"][cb.state_key])
    run.state.load_progress(checkpoint["loop"], checkpoint["global_step"])
    run.state.resume_from = resume_point(run, checkpoint)


def _check_count(path: str, what: str, saved: list, ours: list) -> None:
    """A checkpoint's optimizers (or schedulers) are restored one to one, or not at all: a
    partial restore would train on with some states fresh and say nothing."""
    if len(saved) != len(ours):
        raise CheckpointError(f"checkpoint '{path}' holds {len(saved)} {what} state(s) and configure_optimizers() "
                              f"returned {len(ours)}: resume with the configure_optimizers() it was written with")


_fits_in_this_process = 0


def _count_fit() -> int:
    """Which fit of this program this is (1, 2, ...): a restarted program runs the same fits in
    the same order, so a pretraining fit resumes from its own checkpoints, not a later fit's."""
    global _fits_in_this_process
    _fits_in_this_process += 1
    return _fits_in_this_process


def _checkpoint_to_restart_from(run: Run) -> str | None:
    """In a worker that the elastic agent restarted (``TORCHELASTIC_RESTART_COUNT`` > 0), or in
    a SLURM job that was requeued (``SLURM_RESTART_COUNT`` > 0), the newest checkpoint this run
    wrote before: rank 0 looks, every rank takes its answer. A first attempt resumes nothing."""
    env = os.environ
    restarts = _elastic_restarts(run)
    if restarts and env.get("TORCHELASTIC_RUN_ID"):
        key, value, who = "run_id", env["TORCHELASTIC_RUN_ID"], "workers restarted by the elastic agent"
        count = str(restarts)
    elif int(env.get("SLURM_RESTART_COUNT") or 0) and env.get("SLURM_JOB_ID"):
        key, value, who = "slurm_job_id", env["SLURM_JOB_ID"], f"SLURM job {env['SLURM_JOB_ID']} requeued"
        count = env["SLURM_RESTART_COUNT"]
    else:
        return None
    path = None
    if run.strategy.is_global_zero:
        dirs = [getattr(cb, "dirpath", None) for cb in run.callbacks] + [run.settings.default_root_dir]
        path = ckpt.newest_checkpoint_of_run(dirs, {key: value, "fit_index": run.state.fit_index})
    if run.strategy.is_distributed:
        path = run.strategy.broadcast(path)
    where = f"resuming from {path}" if path else "no checkpoint of this run was found, starting from scratch"
    rank_zero_info(f"fw: {who} (restart {count}): {where}")
    return path


def _elastic_restarts(run: Run) -> int:
    """How often the elastic agents restarted this job's workers, as every rank agrees: on
    several nodes, the agent whose workers were healthy restarts them for the new round
    without counting it, so its ``TORCHELASTIC_RESTART_COUNT`` stays behind the others'."""
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0)
    if os.environ.get("TORCHELASTIC_RUN_ID") and run.strategy.is_distributed:
        mine = torch.tensor(restarts, device=run.strategy.collective_device)
        restarts = int(run.strategy.all_reduce(mine, "max").item())
    return restarts
