"""Evaluation (validate/test) and prediction loops, and the helpers the fit loop shares.

Evaluation runs in eval mode without gradients over this rank's shard (no padding duplicates);
epoch values are computed once at the end, so ranks may see different numbers of batches and
the collectives happen only in ``compute_epoch``.
"""

from __future__ import annotations

import math

import torch

from framework import trainer_state
from framework.errors import ConfigError
from framework.results import MetricCollector


# -- evaluation -----------------------------------------------------------------------------------
def run_eval_stage(trainer, stage: str, checkpoint: dict | None) -> list[dict]:
    loaders = trainer._loaders.get(stage) or []
    if not loaders:
        raise ConfigError(f"{stage} needs data: pass dataloaders= or a datamodule with {_loader_name(stage)}()")
    trainer_state.print_summary(trainer, stage, getattr(loaders[0], "batch_size", None))
    values = run_evaluation(trainer, stage)
    return [{k: float(v) for k, v in values.items() if v.numel() == 1}]


def run_evaluation(trainer, stage: str, limit: int | None = None, log: bool = True) -> dict:
    """One pass over the ``stage`` loaders in eval mode, no gradients; returns epoch metrics."""
    module, hooks = trainer.module, trainer._hooks
    loaders = trainer._loaders.get(stage) or []
    step_fn = module.validation_step if stage == "validate" else module.test_step
    prefix = "validation" if stage == "validate" else "test"
    collector = MetricCollector(stage, trainer._current_batch_size)
    train_collector, trainer._collector = trainer._collector, collector
    was_training = module.training
    module.eval()
    hooks(f"on_{prefix}_start")
    call_hook(trainer, f"on_{prefix}_epoch_start")
    to_device, device = trainer.accelerator.batch_to_device, trainer.strategy.root_device
    try:
        with torch.no_grad():
            for dl_idx, loader in enumerate(loaders):
                n = limit if limit is not None else num_batches(loader, trainer.limits[stage])
                trainer.num_val_batches = n
                for batch_idx, batch in enumerate(loader):
                    if batch_idx >= n:
                        break
                    batch = to_device(batch, device)
                    trainer._current_batch = batch
                    hooks(f"on_{prefix}_batch_start", batch, batch_idx)
                    with trainer.precision.autocast():
                        args = (batch, batch_idx) if len(loaders) == 1 else (batch, batch_idx, dl_idx)
                        outputs = step_fn(*args)
                    hooks(f"on_{prefix}_batch_end", outputs, batch, batch_idx)
        call_hook(trainer, f"on_{prefix}_epoch_end", callbacks=False)
        values = collector.compute_epoch(trainer.strategy, trainer.module)
        if log and not trainer.sanity_checking:
            trainer._epoch_metrics.update(values)
            trainer._prog_bar_keys.update({k: f[0] for k, f in collector.epoch_flags.items()})
            log_epoch_metrics(trainer, collector)
        hooks(f"on_{prefix}_epoch_end")
        hooks(f"on_{prefix}_end")
    finally:
        trainer._collector = train_collector
        module.train(was_training)
    return values


# -- predict --------------------------------------------------------------------------------------
def run_predict(trainer, stage: str, checkpoint: dict | None) -> list:
    module, hooks = trainer.module, trainer._hooks
    loaders = trainer._loaders.get("predict") or []
    if not loaders:
        raise ConfigError("predict needs data: pass dataloaders= or a datamodule with predict_dataloader()")
    module.eval()
    hooks("on_predict_start")
    call_hook(trainer, "on_predict_epoch_start")
    to_device, device = trainer.accelerator.batch_to_device, trainer.strategy.root_device
    predictions: list = []
    with torch.no_grad():
        for loader in loaders:
            n = num_batches(loader, trainer.limits["predict"])
            trainer.num_val_batches = n  # the progress bar's total
            for batch_idx, batch in enumerate(loader):
                if batch_idx >= n:
                    break
                batch = to_device(batch, device)
                hooks("on_predict_batch_start", batch, batch_idx)
                with trainer.precision.autocast():
                    out = module.predict_step(batch, batch_idx)
                hooks("on_predict_batch_end", out, batch, batch_idx)
                predictions.append(out)
    call_hook(trainer, "on_predict_epoch_end")
    hooks("on_predict_end")
    return predictions


# -- helpers --------------------------------------------------------------------------------------
def num_batches(loader, limit: int | float | None) -> float:
    try:
        total = len(loader)
    except TypeError:
        total = math.inf
    if limit is None:
        return total
    if isinstance(limit, float):
        return math.inf if math.isinf(total) else int(total * limit)
    return min(total, limit)



def call_hook(trainer, name: str, callbacks: bool = True) -> None:
    """The callbacks' hook, then the module's, as Lightning orders them. Epoch-end hooks call
    the module alone first (``callbacks=False``), compute the epoch's metrics, and only then
    the callbacks, so that checkpointing and early stopping see what the module logged."""
    if callbacks:
        trainer._hooks(name)
    getattr(trainer.module, name)()



def log_epoch_metrics(trainer, collector) -> None:
    metrics = {k: float(v) for k, v in collector.epoch_values.items()
               if v.numel() == 1 and collector.epoch_flags.get(k, (False, True))[1]}
    if metrics:
        trainer.log_metrics({**metrics, "epoch": trainer.current_epoch}, trainer.global_step)



def _loader_name(stage: str) -> str:
    return {"validate": "val_dataloader", "test": "test_dataloader"}[stage]
