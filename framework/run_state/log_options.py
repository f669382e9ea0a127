"""Where ``self.log`` may be called, and what ``on_step``/``on_epoch`` default to there: Lightning's
table (``_FxValidator``), so that a module written for Lightning logs the same rows on fw.

Per hook: the ``on_step`` values allowed, the ``on_epoch`` values allowed, and the two defaults.
In ``training_step`` and the hooks around a training batch a value is a step value; in
``validation_step``/``test_step`` and their batch hooks an epoch value; in the hooks that run once
an epoch or a stage (``on_train_epoch_end``, ``on_train_start``, ``on_validation_epoch_end``,
...) only an epoch value (it belongs to no step). Where a value would belong to nothing (``setup``,
``on_fit_start``, ``on_train_end``, the checkpoint hooks, ...) ``self.log`` is refused, as in
Lightning. ``HookDispatcher`` says which hook runs (``LoggedMetrics.fx``); in the steps and the
per-batch hooks the stage decides (training: per step; evaluation: per epoch), which is the table.
"""

from __future__ import annotations

from typing import Any

import torch

from framework.errors import ConfigError

_Options = tuple[tuple[bool, ...], tuple[bool, ...], bool, bool]

_PER_STEP: _Options = ((False, True), (False, True), True, False)
_PER_EPOCH: _Options = ((False, True), (False, True), False, True)
_EPOCH_ONLY: _Options = ((False,), (True,), False, True)

OPTIONS: dict[str, _Options | None] = {
    **dict.fromkeys(("training_step", "on_train_batch_start", "on_train_batch_end", "on_before_backward",
                     "backward", "on_after_backward", "on_before_optimizer_step", "optimizer_step",
                     "configure_gradient_clipping", "clip_gradients", "on_before_zero_grad",
                     "optimizer_zero_grad"), _PER_STEP),
    **dict.fromkeys(("validation_step", "test_step", "on_validation_batch_start", "on_validation_batch_end",
                     "on_test_batch_start", "on_test_batch_end"), _PER_EPOCH),
    **dict.fromkeys(("on_train_start", "on_validation_start", "on_test_start", "on_train_epoch_start",
                     "on_train_epoch_end", "on_validation_epoch_start", "on_validation_epoch_end",
                     "on_test_epoch_start", "on_test_epoch_end"), _EPOCH_ONLY),
    **dict.fromkeys(("lr_scheduler_step", "on_fit_start", "on_fit_end", "on_sanity_check_start",
                     "on_sanity_check_end", "on_train_end", "on_validation_end", "on_test_end", "on_predict_start",
                     "on_predict_end", "on_predict_epoch_start", "on_predict_epoch_end", "on_before_batch_transfer",
                     "transfer_batch_to_device", "on_after_batch_transfer", "on_predict_batch_start",
                     "on_predict_batch_end", "on_exception", "state_dict", "on_save_checkpoint",
                     "on_load_checkpoint", "load_state_dict", "setup", "teardown", "configure_sharded_model",
                     "configure_model", "predict_step", "configure_optimizers", "train_dataloader",
                     "val_dataloader", "test_dataloader", "prepare_data", "configure_callbacks",
                     "on_validation_model_zero_grad", "on_validation_model_eval", "on_test_model_eval",
                     "on_validation_model_train", "on_test_model_train"), None),
}


def resolve(fx: str, name: str, on_step: bool | None, on_epoch: bool | None) -> tuple[bool | None, bool | None]:
    """``on_step``/``on_epoch`` for ``self.log(name, ...)`` inside hook ``fx``: the hook's defaults
    where not given; a ``ConfigError`` where the hook cannot log, or not at that level. A hook
    not in the table leaves both as given (the stage decides)."""
    if fx not in OPTIONS:
        return on_step, on_epoch
    options = OPTIONS[fx]
    if options is None:
        raise ConfigError(
            f"self.log('{name}') inside {fx}: a value logged there belongs to no step or epoch, so Lightning "
            f"and fw refuse it; log it in another hook (e.g. on_train_epoch_end) or write to the logger "
            f"directly (self.logger.log_metrics)"
        )
    allowed_step, allowed_epoch, default_step, default_epoch = options
    on_step = default_step if on_step is None else on_step
    on_epoch = default_epoch if on_epoch is None else on_epoch
    for flag, value, allowed in (("on_step", on_step, allowed_step), ("on_epoch", on_epoch, allowed_epoch)):
        if value not in allowed:
            raise ConfigError(
                f"self.log('{name}', {flag}={value}) inside {fx}: there it can only be {flag}={allowed[0]}, "
                f"as in Lightning (the hook runs once an epoch or a stage); drop {flag}"
            )
    return on_step, on_epoch


def useful(name: str, on_step: bool, on_epoch: bool) -> tuple[bool, bool]:
    """Refuses a value logged neither per step nor per epoch (it would go nowhere), as Lightning
    does; the metric collector asks at every ``self.log``, once the flags are resolved."""
    if on_step is False and on_epoch is False:
        raise ConfigError(f"self.log('{name}', on_step=False, on_epoch=False) logs the value nowhere, and Lightning "
                          "refuses it too; pass on_step=True (each step's value) or on_epoch=True (the epoch's)")
    return on_step, on_epoch


#: the reductions Lightning takes as functions, by fw's names for them
_TORCH_REDUCTIONS = {torch.mean: "mean", torch.sum: "sum", torch.max: "max", torch.min: "min"}


def in_fw_terms(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """``self.log``'s Lightning arguments as the collector takes them: ``reduce_fx`` by name
    (Lightning also takes ``torch.mean``/``sum``/``max``/``min`` and ``"avg"``), ``sync_dist`` off
    under ``rank_zero_only`` (Lightning's meaning: only rank 0 logs it, so nothing to reduce);
    ``metric_attribute`` changes nothing fw does; a name with ``/dataloader_idx_`` in it is refused
    under ``add_dataloader_idx=True`` (which adds that itself, as in Lightning); a value with its
    graph or a reduction over a group of the caller's choosing it cannot give, and refuses.
    ``options`` is changed in place (the ``**options`` of ``LoggedMetrics.log``, made for this
    call); ``add_dataloader_idx`` stays in it, for the caller."""
    reduce_fx = options["reduce_fx"]
    if callable(reduce_fx):
        if reduce_fx not in _TORCH_REDUCTIONS:
            raise ConfigError(f"self.log('{name}', reduce_fx={getattr(reduce_fx, '__name__', reduce_fx)}): use mean, "
                              "sum, max or min (or torch.mean, torch.sum, torch.max, torch.min), as in Lightning; "
                              "for another reduction log a torchmetrics Metric")
        options["reduce_fx"] = _TORCH_REDUCTIONS[reduce_fx]
    elif isinstance(reduce_fx, str):
        options["reduce_fx"] = "mean" if reduce_fx.lower() == "avg" else reduce_fx.lower()
    if options.pop("enable_graph"):
        raise ConfigError(f"self.log('{name}', enable_graph=True): fw keeps logged values without their graph; "
                          "drop enable_graph (log the value itself)")
    rank_zero_only, group = options.pop("rank_zero_only"), options.pop("sync_dist_group")
    options["sync_dist"] = bool(options["sync_dist"]) and not rank_zero_only
    if options["sync_dist"] and group is not None:
        raise ConfigError(f"self.log('{name}', sync_dist=True, sync_dist_group=...): fw reduces over the "
                          "data-parallel ranks of the run; leave sync_dist_group unset")
    if options["add_dataloader_idx"] and "/dataloader_idx_" in name:
        raise ConfigError(f"self.log('{name}'): with several loaders fw adds '/dataloader_idx_N' to the name itself, "
                          "as Lightning does; log it without that part, or pass add_dataloader_idx=False")
    options.pop("metric_attribute")
    return options
