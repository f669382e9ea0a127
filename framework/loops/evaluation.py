"""Evaluation (validate/test): one pass over the stage's loaders in eval mode, no gradients.

Each rank reads its own shard (no padding duplicates, see ``framework/data/sampler_injection.py``);
epoch values are computed once at the end, so ranks may see different numbers of batches and
the collectives happen only in ``compute_epoch``. The same pass serves ``trainer.validate()``,
``trainer.test()``, validation inside fit, and the sanity check (which logs nothing).
"""

from __future__ import annotations

import torch

from framework.errors import ConfigError
from framework.loops.batches import num_batches, positional_arity

_LOADER_NAMES = {"validate": "val_dataloader", "test": "test_dataloader"}


def run_eval_stage(trainer, fn: str) -> list[dict]:
    """``trainer.validate()`` / ``trainer.test()``: one pass, its scalar results."""
    if not trainer.loaders.get(fn):
        raise ConfigError(f"{fn} needs data: pass dataloaders= or a datamodule with {_LOADER_NAMES[fn]}()")
    values = run_evaluation(trainer, fn)
    aliases = {k for k in values if f"{k}_epoch" in values}  # Lightning returns ``x_epoch`` only
    return [{k: float(v) for k, v in values.items() if v.numel() == 1 and k not in aliases}]


def run_evaluation(trainer, stage: str, limit: int | None = None, log: bool = True) -> dict:
    """One pass over the ``stage`` loaders in eval mode, no gradients; returns epoch metrics."""
    module, hooks, state = trainer.module, trainer.hooks, trainer.state
    loaders = trainer.loaders.get(stage) or []
    step_fn = module.validation_step if stage == "validate" else module.test_step
    arity = positional_arity(step_fn)
    prefix = "validation" if stage == "validate" else "test"
    sanity_check = state.stage == "sanity_check"
    outer_stage, state.stage = state.stage, state.stage if sanity_check else stage
    was_training = module.training
    module.eval()
    to_device, device = trainer.accelerator.batch_to_device, trainer.strategy.root_device
    try:
        no_grad = torch.inference_mode() if trainer.inference_mode else torch.no_grad()  # Lightning's switch
        with trainer.metrics.evaluating(stage) as collector, no_grad:
            hooks(f"on_{prefix}_start")
            hooks(f"on_{prefix}_epoch_start")
            batch_start = hooks.per_batch(f"on_{prefix}_batch_start")
            batch_end = hooks.per_batch(f"on_{prefix}_batch_end")
            for dl_idx, loader in enumerate(loaders):
                n = num_batches(loader, trainer.limits[stage])
                if limit is not None:  # the sanity check: at most ``limit`` of them
                    n = min(n, limit)
                trainer.num_val_batches = n
                for batch_idx, batch in enumerate(loader):
                    if batch_idx >= n:
                        break
                    batch = trainer.metrics.current_batch = to_device(batch, device)
                    trainer.state.eval_batches += 1
                    where = (batch_idx,) if len(loaders) == 1 else (batch_idx, dl_idx)  # Lightning's arguments
                    if batch_start is not None:
                        batch_start(batch, *where)
                    with trainer.precision.autocast():
                        args = (batch, batch_idx) if len(loaders) == 1 else (batch, batch_idx, dl_idx)
                        outputs = step_fn(*args[:arity])
                    if batch_end is not None:
                        batch_end(outputs, batch, *where)
            hooks.module_hook(f"on_{prefix}_epoch_end")  # the module first, then its metrics, then callbacks
            values = collector.compute_epoch(trainer.strategy, trainer.module)
            if log and not sanity_check:
                trainer.metrics.record_epoch(collector)
                log_epoch_metrics(trainer, collector)
            hooks.callbacks(f"on_{prefix}_epoch_end")
            hooks(f"on_{prefix}_end")
    finally:
        state.stage = outer_stage
        module.train(was_training)
    return values


def log_epoch_metrics(trainer, collector) -> None:
    """Send ``collector``'s scalar epoch values that may be logged to the loggers."""
    metrics = {k: float(v) for k, v in collector.epoch_values.items()   # the ``x_epoch`` names, not the
               if v.numel() == 1 and collector.epoch_flags.get(k, (False, False))[1]}  # plain ``x`` alias
    if metrics:
        trainer.log_metrics({**metrics, "epoch": trainer.current_epoch}, trainer.state.log_step)
