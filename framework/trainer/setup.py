"""What a run builds before its loop starts, and what it releases at the end.

``setup``: the process group and device, the data (``prepare_data`` on local rank 0, then
``setup(stage)`` of the DataModule, the callbacks and the module, then ``configure_model``, then
every loader sharded for this rank), the loggers and the run directory, the hook dispatcher,
the wrapped model and the optimisers. ``teardown``: the hooks, the loggers,
the strategy (process group), and every process-wide setting the run changed, put back.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from framework.checkpoint import check_writable_on_every_rank, plain_hparams
from framework.data import DataModule, shard_dataloader
from framework.data.sampler_injection import without_shuffle
from framework.errors import ConfigError
from framework.loops.optimization import check_one_optimizer
from framework.optim import parse_optimizers
from framework.rank_zero import rank_zero_info, rank_zero_warn
from framework.seed import sampler_seed
from framework.trainer import arguments as args
from framework.trainer import checkpointing
from framework.trainer.differences import note_differences
from framework.trainer.hooks import HookDispatcher, overrides

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


def without_dev_run_callbacks(callbacks: list) -> list:
    from framework.callbacks import EarlyStopping, LearningRateMonitor, ModelCheckpoint

    return [c for c in callbacks if not isinstance(c, (ModelCheckpoint, EarlyStopping, LearningRateMonitor))]


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
def setup(trainer, fn: str, model, datamodule: DataModule | None, loaders: dict, ckpt_path: Any) -> str | None:
    """Process group, data, loggers, hooks, the wrapped model and (for fit) the optimisers.
    Returns the checkpoint to start from (see ``checkpointing.resolve_path``): a resumed run
    logs into the version folder its checkpoint came from."""
    strategy = trainer.strategy
    _refuse_hooks_fw_does_not_call(model)
    _attach_model_callbacks(trainer, model)
    trainer.hooks = HookDispatcher(trainer.callbacks, trainer, model)
    _apply_process_settings(trainer)
    strategy.setup_environment()
    trainer.module = model
    model.trainer = trainer
    trainer.datamodule = datamodule
    if strategy.local_rank == 0:  # downloads and files: once per node
        if datamodule is not None:
            datamodule.prepare_data()
        model.prepare_data()
    strategy.barrier("prepare_data")
    if datamodule is not None:
        datamodule.setup(fn)
    resume_path = checkpointing.resolve_path(trainer, ckpt_path, fn)
    _setup_loggers(trainer, resume_path)  # the run directory, which the callbacks' setup may use
    trainer.hooks.callbacks("setup", fn)  # Lightning's order: the DataModule, the callbacks, the module
    model.setup(fn)
    model.configure_model()
    trainer.metrics.strategy = strategy if strategy.is_distributed else None
    seed = sampler_seed()
    source = datamodule if datamodule is not None else model  # Lightning: the module's own *_dataloader()
    trainer._loader_requests = (loaders, source, seed)
    trainer.loaders = {
        key: _prepare_loaders(trainer, key, given, source, seed) if _needs_loader(trainer, fn, key, model, given, source)
        else []
        for key, given in loaders.items()
        if given is not None or datamodule is not None or _defines_loader(model, key)
    }
    strategy.setup_module(model)
    if fn == "fit":
        trainer.optimizers, trainer.lr_scheduler_configs = parse_optimizers(model.configure_optimizers())
        if model.automatic_optimization:
            check_one_optimizer(trainer)
    note_differences(trainer, fn, resume_path)
    return resume_path


def reload_loaders(trainer) -> None:
    """``reload_dataloaders_every_n_epochs``: ask the DataModule (or the module) for its
    training and validation loaders again; loaders passed to ``fit`` directly stay."""
    loaders, source, seed = trainer._loader_requests
    for key in ("train", "validate"):
        if loaders.get(key) is None and trainer.loaders.get(key):
            trainer.loaders[key] = _prepare_loaders(trainer, key, None, source, seed)


#: Lightning hooks fw does not call, with what to do instead: an override is refused, never ignored
_NOT_CALLED = {
    "configure_sharded_model": "it is Lightning's deprecated hook; build the layers in configure_model() instead",
}


def _refuse_hooks_fw_does_not_call(model) -> None:
    for name, instead in _NOT_CALLED.items():
        if callable(getattr(type(model), name, None)):
            raise ConfigError(f"{type(model).__name__}.{name}() is overridden but fw does not call it: {instead}")


def _attach_model_callbacks(trainer, model) -> None:
    """``configure_callbacks()``: each replaces the Trainer's callbacks of its type (Lightning's rule)."""
    from framework.callbacks import ModelCheckpoint

    extra = model.configure_callbacks()
    extra = args.check_callbacks(args.as_list(extra)) if extra else []
    if not extra:
        return
    types = {type(cb) for cb in extra}
    kept = [cb for cb in trainer.callbacks if type(cb) not in types]
    trainer.callbacks = sorted(kept + extra, key=lambda c: isinstance(c, ModelCheckpoint))


def _defines_loader(model, key: str) -> bool:
    from framework.module import TrainModule

    return overrides(model, TrainModule, _LOADER_METHODS[key])


def _needs_loader(trainer, fn: str, key: str, model, given: Any, source: Any) -> bool:
    """Fit asks for a validation loader only when it validates: the module has a
    ``validation_step`` and ``limit_val_batches`` is not 0, as in Lightning (which skips the
    loop, sanity check included, otherwise, and never asks for the loader)."""
    from framework.data import DataModule
    from framework.module import TrainModule

    if fn != "fit" or key != "validate":
        return True
    if trainer.limits["validate"] == 0:
        return False
    if overrides(model, TrainModule, "validation_step"):
        return True
    base = DataModule if isinstance(source, DataModule) else TrainModule
    if given is not None or overrides(source, base, "val_dataloader"):
        rank_zero_warn(f"validation data was given but {type(model).__name__} has no validation_step: "
                       "fit skips validation (define validation_step to validate)")
    return False


def _prepare_loaders(trainer, key: str, given: Any, datamodule, seed: int) -> list:
    try:
        loader = given if given is not None else getattr(datamodule, _LOADER_METHODS[key])()
    except ValueError as err:  # torch's RandomSampler on an empty data set
        if "num_samples=0" not in str(err):
            raise
        raise ConfigError(f"{type(datamodule).__name__}.{_LOADER_METHODS[key]}(): the data set is empty "
                          "(a shuffling DataLoader needs at least one sample); check the data") from None
    if loader is None:
        return []
    loaders = list(loader) if isinstance(loader, (list, tuple)) else [loader]
    if key == "train" and trainer.overfit_batches:
        loaders = [without_shuffle(dl) for dl in loaders]
    shard = trainer.strategy.distributed_sampler_kwargs() if trainer.use_distributed_sampler else None
    if shard:
        loaders = [shard_dataloader(dl, train=(key == "train"), seed=seed, **shard) for dl in loaders]
    return loaders


def _setup_loggers(trainer, resume_path: str | None) -> None:
    check_writable_on_every_rank(trainer.default_root_dir, "trainer.default_root_dir", trainer.strategy)
    for lg in trainer.loggers:
        lg.set_default_root(trainer.default_root_dir, resume_from=resume_path)
    log_dir = trainer.loggers[0].log_dir if trainer.loggers and trainer.is_global_zero else None
    trainer.log_dir = trainer.strategy.broadcast(log_dir) if trainer.strategy.is_distributed else log_dir
    if trainer.is_global_zero:
        hparams = plain_hparams(getattr(trainer.module, "hparams", {}) or {})
        for lg in trainer.loggers:
            lg.log_hyperparams(hparams)


def print_summary(trainer, fn: str) -> None:
    """One line on rank 0: strategy, backend, init method, world size, device, batch sizes
    (nothing for predict, or when the stage has no data: its loop says so)."""
    loaders = trainer.loaders.get({"fit": "train"}.get(fn, fn)) or []
    if fn == "predict" or not loaders:
        return
    per_device_batch = getattr(loaders[0], "batch_size", None)
    info = trainer.strategy.describe()
    parts = [f"fw {fn}: strategy {trainer.strategy.name}"]
    if "backend" in info:
        parts.append(f"backend {info['backend']}, init {info['init_method']}")
    parts.append(f"world size {trainer.world_size}" + (f", {info['threads']} thread(s) per process"
                                                        if trainer.world_size > 1 and "threads" in info else ""))
    parts.append(f"device {info['device']}, precision {trainer.precision.precision}")
    if per_device_batch:
        replicas = info.get("replicas", 1)  # DataParallel splits one loader batch over its GPUs
        per_device = per_device_batch // replicas if replicas > 1 else per_device_batch
        parts.append(f"batch {per_device} per device, global {per_device * replicas * trainer.world_size}")
    rank_zero_info(" | ".join(parts))
    if fn == "fit" and trainer.enable_model_summary and trainer.is_global_zero:
        from framework.trainer.summary import print_model_summary

        print_model_summary(trainer.module)


def report_where_it_went(trainer) -> None:
    """One line at the end of a fit: where its logs and its best and last checkpoints are."""
    parts = [f"fw fit: done at step {trainer.global_step}"]
    if trainer.log_dir:
        parts.append(f"logs in {trainer.log_dir}")
    for cb in trainer.checkpoint_callbacks:
        if cb.best_model_path:
            parts.append(f"best checkpoint {cb.best_model_path}")
        if cb.last_model_path and cb.last_model_path != cb.best_model_path:
            parts.append(f"last checkpoint {cb.last_model_path}")
    rank_zero_info(" | ".join(parts))


def _apply_process_settings(trainer) -> None:
    """Set what ``deterministic`` asks for, keeping the values before the run so that teardown
    puts them back: a later Trainer in the same process starts from a clean slate."""
    trainer._settings_before_run = (torch.are_deterministic_algorithms_enabled(),
                                    os.environ.get("CUBLAS_WORKSPACE_CONFIG"), torch.backends.cudnn.benchmark)
    if trainer.deterministic:
        torch.use_deterministic_algorithms(True)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    if trainer.benchmark is not None:
        torch.backends.cudnn.benchmark = trainer.benchmark


def _restore_process_settings(trainer) -> None:
    saved = getattr(trainer, "_settings_before_run", None)
    if saved is None:
        return
    deterministic, cublas, benchmark = saved
    torch.use_deterministic_algorithms(deterministic)
    torch.backends.cudnn.benchmark = benchmark
    if cublas is None:
        os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    else:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = cublas
    trainer._settings_before_run = None


# -- teardown -------------------------------------------------------------------------------------
def teardown(trainer, fn: str, failed: bool = False) -> None:
    """After a failure the ``teardown`` hooks are not called, as in Lightning (``on_exception``
    was); the loggers, the process group and the process settings are released either way."""
    try:
        if not failed:
            if trainer.hooks is not None:
                trainer.hooks.callbacks("teardown", fn)
            if trainer.datamodule is not None:
                trainer.datamodule.teardown(fn)
            if trainer.module is not None:
                trainer.module.teardown(fn)
        if trainer.is_global_zero:
            for lg in trainer.loggers:
                lg.finalize("failed" if failed else "success")
    finally:
        trainer.strategy.teardown()
        _restore_process_settings(trainer)
        trainer.state.fn, trainer.state.stage = None, None
        trainer.manual = None
        trainer.metrics.strategy = None
