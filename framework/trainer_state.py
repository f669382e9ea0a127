"""Set-up, teardown and checkpoint contents of a Trainer run.

Kept apart from ``trainer.py`` so that each reads top to bottom: here is what a run builds
before its loop starts, what it restores from a checkpoint, what it writes into one, and what it
releases at the end.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch.distributed


from framework import checkpoint as ckpt
from framework.data import DataModule, shard_dataloader
from framework.errors import CheckpointError, ConfigError
from framework.hooks import HookDispatcher
from framework.optim import parse_optimizers
from framework.rank_zero import rank_zero_print, rank_zero_warn
from framework.seed import get_rng_state, global_seed, set_rng_state

_LOADER_METHODS = {
    "train": "train_dataloader",
    "validate": "val_dataloader",
    "test": "test_dataloader",
    "predict": "predict_dataloader",
}


# -- construction-time helpers --------------------------------------------------------------------
def default_callbacks(callbacks: list, enable_checkpointing: bool, enable_progress_bar: bool) -> list:
    from framework.callbacks import ModelCheckpoint, RichProgressBar

    callbacks = list(callbacks)
    if enable_checkpointing and not any(isinstance(c, ModelCheckpoint) for c in callbacks):
        callbacks.append(ModelCheckpoint())
    if not enable_checkpointing:
        callbacks = [c for c in callbacks if not isinstance(c, ModelCheckpoint)]
    if enable_progress_bar and not any(isinstance(c, RichProgressBar) for c in callbacks):
        callbacks.append(RichProgressBar())
    if not enable_progress_bar:
        callbacks = [c for c in callbacks if not isinstance(c, RichProgressBar)]
    # checkpointing runs last so it sees what early stopping and others decided
    return sorted(callbacks, key=lambda c: isinstance(c, ModelCheckpoint))


def resolve_loggers(logger: Any) -> list:
    from framework.loggers import Logger, TensorBoardLogger

    if logger is True:
        return [TensorBoardLogger()]
    if logger in (False, None):
        return []
    loggers = list(logger) if isinstance(logger, (list, tuple)) else [logger]
    for lg in loggers:
        if not isinstance(lg, Logger):
            raise ConfigError(
                f"logger: {lg!r} is not an fw Logger; use true, false, or a mapping like "
                "{_target_: framework.loggers.TensorBoardLogger}"
            )
    return loggers


# -- set-up ---------------------------------------------------------------------------------------
def setup(trainer, stage: str, model, datamodule: DataModule | None, loaders: dict) -> None:
    """Process group, data, loggers, callbacks, optimisers and the wrapped model."""
    strategy = trainer.strategy
    strategy.setup_environment()
    trainer.module = model
    model.trainer = trainer
    trainer.datamodule = datamodule
    if datamodule is not None:
        if strategy.local_rank == 0:
            datamodule.prepare_data()
        strategy.barrier("prepare_data")
        datamodule.setup("fit" if stage == "fit" else stage)
    trainer._loaders = {
        key: _prepare_loaders(trainer, key, given, datamodule)
        for key, given in loaders.items()
        if given is not None or datamodule is not None
    }
    _setup_loggers(trainer)
    trainer._hooks = HookDispatcher(trainer.callbacks, trainer, model)
    trainer._hooks("setup", stage)
    strategy.setup_module(model)
    if stage == "fit":
        trainer.optimizers, trainer.lr_scheduler_configs = parse_optimizers(model.configure_optimizers())


def _prepare_loaders(trainer, key: str, given: Any, datamodule) -> list:
    loader = given if given is not None else getattr(datamodule, _LOADER_METHODS[key])()
    if loader is None:
        return []
    loaders = list(loader) if isinstance(loader, (list, tuple)) else [loader]
    shard = trainer.strategy.distributed_sampler_kwargs()
    if shard:
        loaders = [shard_dataloader(dl, train=(key == "train"), seed=global_seed(), **shard) for dl in loaders]
    return loaders


def _setup_loggers(trainer) -> None:
    for lg in trainer.loggers:
        lg.set_default_root(trainer.default_root_dir)
    log_dir = trainer.loggers[0].log_dir if trainer.loggers and trainer.is_global_zero else None
    trainer.log_dir = trainer.strategy.broadcast(log_dir) if trainer.strategy.is_distributed else log_dir
    if trainer.is_global_zero:
        if trainer._recipe_text is not None:
            where = Path(trainer.log_dir or trainer.default_root_dir)
            where.mkdir(parents=True, exist_ok=True)
            (where / "config.yaml").write_text(trainer._recipe_text)
        hparams = ckpt.plain_hparams(getattr(trainer.module, "hparams", {}) or {})
        for lg in trainer.loggers:
            lg.log_hyperparams(hparams)


def print_summary(trainer, stage: str, per_device_batch: int | None) -> None:
    """One line on rank 0: strategy, backend, init method, world size, device, batch sizes."""
    info = trainer.strategy.describe()
    parts = [f"fw {stage}: strategy {trainer.strategy.name}"]
    if "backend" in info:
        parts.append(f"backend {info['backend']}, init {info['init_method']}")
    parts.append(f"world size {trainer.world_size}")
    parts.append(f"device {info['device']}, precision {trainer.precision.precision}")
    if per_device_batch:
        replicas = info.get("replicas", 1)  # DataParallel splits one loader batch over its GPUs
        per_device = per_device_batch // replicas if replicas > 1 else per_device_batch
        parts.append(f"batch {per_device} per device, global {per_device * replicas * trainer.world_size}")
    rank_zero_print(" | ".join(parts))


# -- checkpoints ----------------------------------------------------------------------------------
def save(trainer, path) -> None:
    """Gather every rank's RNG state, write on rank 0, then wait for it on every rank.

    Outside a run (after ``fit`` returned, its process group gone) there is nobody to gather
    from or wait for: rank 0 writes its own state.
    """
    if trainer.module is None:
        raise ConfigError("save_checkpoint: no model yet; call it during or after fit/validate/test")
    strategy = trainer.strategy
    live = strategy.is_distributed and torch.distributed.is_available() and torch.distributed.is_initialized()
    mine = {"now": get_rng_state(), "epoch_start": trainer._epoch_start_rng}
    rng = strategy.all_gather_object(mine) if live else [mine]
    error: Exception | None = None
    if strategy.is_global_zero:
        try:
            ckpt.atomic_save(dump(trainer, rng), path)
        except Exception as exc:  # disk full, permissions: the other ranks must not wait for it
            error = exc
    # every rank learns whether rank 0's write succeeded (this is also the barrier)
    if live and not strategy.reduce_boolean_decision(error is None, all=True) and error is None:
        raise CheckpointError(f"rank 0 failed to write the checkpoint '{path}'; its own error says why")
    if error is not None:
        raise error


def dump(trainer, rng_per_rank: list) -> dict:
    module = trainer.module
    checkpoint = {
        "fw_format": ckpt.FORMAT_VERSION,
        "epoch": trainer.current_epoch,
        "global_step": trainer.global_step,
        "loop": dict(trainer._loop_position),
        "state_dict": module.state_dict(),
        "optimizer_states": [opt.state_dict() for opt in trainer.optimizers],
        "lr_schedulers": [cfg.scheduler.state_dict() for cfg in trainer.lr_scheduler_configs],
        "precision": trainer.precision.state_dict(),
        "callbacks": {cb.state_key: cb.state_dict() for cb in trainer.callbacks},
        "hyper_parameters": ckpt.plain_hparams(getattr(module, "hparams", {}) or {}),
        "rng": rng_per_rank,
        "world_size": trainer.world_size,
    }
    module.on_save_checkpoint(checkpoint)
    trainer._hooks("on_save_checkpoint", checkpoint)
    return checkpoint


def restore(trainer, ckpt_path: Any, stage: str) -> dict | None:
    """Load weights (and for fit, everything else) from ``ckpt_path``; RNG is restored later,
    by the loop, once the sanity check has run."""
    if ckpt_path is None:
        return None
    if ckpt_path == "last":
        dirs = [getattr(cb, "dirpath", None) for cb in trainer.callbacks]
        ckpt_path = ckpt.find_last_checkpoint(dirs, trainer.default_root_dir)
        if ckpt_path is None:
            rank_zero_warn(f"ckpt_path='last': no last.ckpt under {trainer.default_root_dir}; starting fresh")
            return None
    checkpoint = ckpt.load_checkpoint(ckpt_path)
    module = trainer.module
    module.on_load_checkpoint(checkpoint)
    try:
        module.load_state_dict(checkpoint["state_dict"])
    except RuntimeError as err:
        raise ConfigError(f"checkpoint '{ckpt_path}' does not fit this model: {str(err).splitlines()[0]}") from None
    if stage != "fit":
        return checkpoint
    for opt, state in zip(trainer.optimizers, checkpoint["optimizer_states"]):
        opt.load_state_dict(state)
    for cfg, state in zip(trainer.lr_scheduler_configs, checkpoint["lr_schedulers"]):
        cfg.scheduler.load_state_dict(state)
    trainer.precision.load_state_dict(checkpoint.get("precision", {}))
    for cb in trainer.callbacks:
        if cb.state_key in checkpoint.get("callbacks", {}):
            cb.load_state_dict(checkpoint["callbacks"][cb.state_key])
    trainer._hooks("on_load_checkpoint", checkpoint)
    trainer.global_step = checkpoint["global_step"]
    loop = checkpoint["loop"]
    trainer.current_epoch = loop["epoch"] + 1 if loop["epoch_finished"] else loop["epoch"]
    trainer._resume = {"batches_done": 0 if loop["epoch_finished"] else loop["batches_done"]}
    return checkpoint


def restore_rng(trainer, checkpoint: dict | None) -> None:
    """Put back this rank's RNG state; mid-epoch, first the epoch-start state (to rebuild the
    same data order) — the loop restores the rest after skipping the batches already done."""
    if checkpoint is None:
        return
    states = checkpoint["rng"]
    rank = trainer.global_rank
    if len(states) != trainer.world_size:
        rank_zero_warn(
            f"checkpoint was written by {len(states)} ranks, this run has {trainer.world_size}: "
            "RNG states are reused from rank 0, so the run will not be bit-identical"
        )
        rank = 0
    mine = states[rank]
    if trainer._resume["batches_done"] and mine["epoch_start"] is not None:
        set_rng_state(mine["epoch_start"])
        trainer._resume["rng_after_skip"] = mine["now"]
    else:
        set_rng_state(mine["now"])


# -- teardown -------------------------------------------------------------------------------------
def teardown(trainer, stage: str, failed: bool = False) -> None:
    try:
        trainer._hooks("teardown", stage)
        if trainer.datamodule is not None:
            trainer.datamodule.teardown(stage)
        if trainer.is_global_zero:
            for lg in trainer.loggers:
                lg.finalize("failed" if failed else "success")
    finally:
        trainer.strategy.teardown()
        trainer.stage = None
