"""Predict: ``predict_step`` over the predict loaders in eval mode, no gradients; the outputs
are returned in order. The module's training mode is put back afterwards."""

from __future__ import annotations

import torch

from framework.errors import ConfigError
from framework.loops.batches import num_batches


def run_predict(trainer, fn: str) -> list:
    module, hooks = trainer.module, trainer.hooks
    loaders = trainer.loaders.get("predict") or []
    if not loaders:
        raise ConfigError("predict needs data: pass dataloaders= or a datamodule with predict_dataloader()")
    was_training = module.training
    module.eval()
    trainer.state.stage = "predict"
    to_device, device = trainer.accelerator.batch_to_device, trainer.strategy.root_device
    predictions: list = []
    try:
        hooks.callbacks("on_predict_start")
        hooks("on_predict_epoch_start")
        with torch.no_grad():
            for loader in loaders:
                n = num_batches(loader, trainer.limits["predict"])
                trainer.num_val_batches = n  # the progress bar's total
                for batch_idx, batch in enumerate(loader):
                    if batch_idx >= n:
                        break
                    batch = to_device(batch, device)
                    hooks.callbacks("on_predict_batch_start", batch, batch_idx)
                    with trainer.precision.autocast():
                        out = module.predict_step(batch, batch_idx)
                    hooks.callbacks("on_predict_batch_end", out, batch, batch_idx)
                    predictions.append(out)
        hooks("on_predict_epoch_end")
        hooks.callbacks("on_predict_end")
    finally:
        module.train(was_training)
    return predictions
