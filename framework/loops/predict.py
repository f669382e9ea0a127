"""Predict: ``predict_step`` over the predict loaders in eval mode, no gradients; the outputs
are returned in order (a list per loader when there are several, as in Lightning; nothing with
``return_predictions=False``). Every submodule's training mode is put back afterwards."""

from __future__ import annotations

from typing import TYPE_CHECKING

from framework.errors import ConfigError
from framework.loops.batches import num_batches, up_to
from framework.loops.eval_batch import batch_call
from framework.loops.evaluation import ModuleModes
from framework.loops.transfer import batch_transfer_fn
from framework.module.step_arity import positional_arity
from framework.profilers.timing import PREDICT_NEXT

if TYPE_CHECKING:
    from framework.trainer.run import Run


def run_predict(run: Run) -> list | None:
    module, hooks = run.module, run.hooks
    loaders = run.loaders.get("predict") or []
    if not loaders:
        raise ConfigError("predict needs data: pass dataloaders= or a datamodule with predict_dataloader()")
    modes = ModuleModes(module)
    hooks.module_hook("on_predict_model_eval")
    run.state.stage = "predict"
    keep = run.return_predictions
    arity = positional_arity(module.predict_step)
    predict_step = hooks.strategy_fn("predict_step", run.precision.converting(run.strategy.step_fn(module, "predict_step")))
    per_loader: list[list] = []
    try:
        hooks("on_predict_start")
        hooks("on_predict_epoch_start")
        call = batch_call(run, predict_step, arity, hooks.per_batch("on_predict_batch_start"),
                          hooks.per_batch("on_predict_batch_end"), len(loaders))
        with run.strategy.no_grad(run.settings.inference_mode):
            for dl_idx, loader in enumerate(loaders):
                predictions: list = []
                per_loader.append(predictions)
                n = num_batches(loader, run.settings.limits["predict"])
                run.num_val_batches = n  # the progress bar's total
                to_device = batch_transfer_fn(run, dl_idx)
                for batch_idx, batch in enumerate(hooks.fetching(up_to(iter(loader), n), PREDICT_NEXT, n)):
                    if batch_idx >= n:
                        break
                    out = call(to_device(batch) if to_device is not None else batch, batch_idx, dl_idx)
                    if keep:
                        predictions.append(out)
        hooks("on_predict_epoch_end")
        hooks("on_predict_end")
    finally:
        modes.restore()
    if not keep:
        return None
    return per_loader[0] if len(per_loader) == 1 else per_loader
