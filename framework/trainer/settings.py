"""``Settings``: the Trainer's keyword arguments, checked and resolved once, as a frozen value.

``Trainer.__init__``'s signature is the one list of the arguments (the recipe schema is derived
from it); ``Settings.resolve`` turns what was passed into what a run follows: ``max_epochs`` made
explicit, the limits as one mapping, ``fast_dev_run``, ``overfit_batches`` and ``barebones``
applied to what they override. Nothing changes a ``Settings`` afterwards (a run that needs to
count or switch something keeps it in its ``Run``); the Trainer reads it under Lightning's
names (``trainer.max_epochs``, ``trainer.limit_val_batches``, ...).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from framework.compile import compile_options
from framework.errors import raised_alike_on_every_rank
from framework.loops.batches import LIMIT_ARGUMENTS
from framework.parallel.activation_checkpointing import policy_names
from framework.paths import storage_path
from framework.trainer import arguments as args

if TYPE_CHECKING:
    from framework.run_state.state import RunState


@dataclass(frozen=True)
class Limits:
    """``limit_*_batches`` per stage (None: all batches): ``limits["validate"]`` is
    ``limit_val_batches``. An int counts batches, a float is a fraction of the loader."""

    train: int | float | None
    validate: int | float | None
    test: int | float | None
    predict: int | float | None

    def __getitem__(self, stage: str) -> int | float | None:
        return getattr(self, stage)


@dataclass(frozen=True)
class Settings:
    """What a Trainer's runs follow (see ``Trainer``'s docstring for each argument).

    ``max_epochs`` is -1 for no bound (1000 when no stop was given at all, as in Lightning);
    ``limits`` maps each stage to its ``limit_*_batches`` (None: all); ``enable_logger`` is
    False when ``barebones`` or ``fast_dev_run`` turn the loggers off.
    """

    max_epochs: int
    min_epochs: int
    max_steps: int
    min_steps: int
    max_time: float | None
    limits: Limits
    val_check_interval: int | float | None
    check_val_every_n_epoch: int | None
    num_sanity_val_steps: int
    log_every_n_steps: int
    accumulate_grad_batches: int
    gradient_clip_val: float | None
    gradient_clip_algorithm: str | None
    deterministic: bool
    on_nonfinite: str
    preemption_signal: str | None
    requeue: bool
    default_root_dir: str
    barebones: bool
    enable_checkpointing: bool
    enable_progress_bar: bool
    enable_model_summary: bool
    enable_logger: bool
    overfit_batches: int | float
    fast_dev_run: int
    reload_dataloaders_every_n_epochs: int
    benchmark: bool | None
    detect_anomaly: bool
    inference_mode: bool
    use_distributed_sampler: bool
    sampler_chosen: bool  # use_distributed_sampler was given (None: True, and fw notes its one order)
    sync_batchnorm: bool
    max_restarts: int
    rdzv_endpoint: str | None
    activation_checkpointing: frozenset[str]
    compile: dict[str, Any] | None

    def may_stop(self, state: RunState) -> bool:
        """Is a stop asked for (``should_stop``, ``max_time``) taken now? Once ``min_epochs``
        epochs and ``min_steps`` optimizer steps are done, as in Lightning."""
        return state.epoch >= self.min_epochs and state.global_step >= self.min_steps

    @classmethod
    @raised_alike_on_every_rank()  # the arguments alone: the same refusal on every rank
    def resolve(cls, *, max_epochs: int | None, min_epochs: int | None, max_steps: int, max_time: Any,
                limit_train_batches: Any, limit_val_batches: Any, limit_test_batches: Any, limit_predict_batches: Any,
                val_check_interval: Any, check_val_every_n_epoch: int | None, num_sanity_val_steps: int,
                log_every_n_steps: int, accumulate_grad_batches: int, gradient_clip_val: float | None,
                gradient_clip_algorithm: str | None, deterministic: bool, on_nonfinite: str,
                preemption_signal: str | None, requeue: bool, default_root_dir: Any, barebones: bool,
                enable_checkpointing: bool, enable_progress_bar: bool, enable_model_summary: bool,
                overfit_batches: int | float, fast_dev_run: int | bool, reload_dataloaders_every_n_epochs: int,
                benchmark: bool | None, detect_anomaly: bool, inference_mode: bool, use_distributed_sampler: bool | None,
                sync_batchnorm: bool, max_restarts: int, rdzv_endpoint: str | None,
                activation_checkpointing_policy: Any, compile: Any, min_steps: int | None) -> Settings:
        """Check every argument (a ConfigError names the first wrong one); apply the switches."""
        if max_epochs is None and max_steps == -1 and max_time is None:
            max_epochs = 1000
        limits = {stage: args.limit_arg(LIMIT_ARGUMENTS[stage], value) for stage, value in (
            ("train", limit_train_batches), ("validate", limit_val_batches), ("test", limit_test_batches),
            ("predict", limit_predict_batches))}
        switched: dict[str, Any] = dict(
            max_epochs=max_epochs if max_epochs is not None else -1,
            max_steps=int(max_steps),
            val_check_interval=args.check_val_check_interval(val_check_interval, check_val_every_n_epoch),
            check_val_every_n_epoch=None if check_val_every_n_epoch is None
            else args.positive_int("check_val_every_n_epoch", check_val_every_n_epoch),
            num_sanity_val_steps=int(num_sanity_val_steps),
            enable_checkpointing=bool(enable_checkpointing),
            enable_progress_bar=bool(enable_progress_bar),
            enable_model_summary=bool(enable_model_summary),
            enable_logger=True,
        )
        overfit, dev_run = args.limit_arg("overfit_batches", overfit_batches) or 0, args.fast_dev_run_arg(fast_dev_run)
        _switch(switched, limits, bool(barebones), overfit, dev_run)
        return cls(
            min_epochs=min_epochs or 0,
            min_steps=min_steps or 0,
            max_time=args.parse_max_time(max_time),
            limits=Limits(**limits),
            log_every_n_steps=args.non_negative_int("log_every_n_steps", log_every_n_steps),  # 0: no step rows
            accumulate_grad_batches=args.positive_int("accumulate_grad_batches", accumulate_grad_batches),
            gradient_clip_val=gradient_clip_val,
            gradient_clip_algorithm=args.clip_algorithm(gradient_clip_algorithm),
            deterministic=bool(deterministic),
            on_nonfinite=args.one_of("on_nonfinite", on_nonfinite, ("error", "skip", "warn")),
            preemption_signal=args.signal_arg("preemption_signal", preemption_signal),
            requeue=bool(requeue),
            default_root_dir=storage_path(default_root_dir, "trainer.default_root_dir") if default_root_dir else os.getcwd(),
            barebones=bool(barebones),
            overfit_batches=overfit,
            fast_dev_run=dev_run,
            reload_dataloaders_every_n_epochs=args.non_negative_int("reload_dataloaders_every_n_epochs",
                                                                    reload_dataloaders_every_n_epochs),
            benchmark=benchmark if benchmark is None else bool(benchmark),
            detect_anomaly=bool(detect_anomaly), inference_mode=bool(inference_mode),
            use_distributed_sampler=use_distributed_sampler is None or bool(use_distributed_sampler),
            sampler_chosen=use_distributed_sampler is not None,
            sync_batchnorm=bool(sync_batchnorm), max_restarts=int(max_restarts),
            rdzv_endpoint=rdzv_endpoint,
            activation_checkpointing=policy_names(activation_checkpointing_policy),
            compile=compile_options(compile),
            **switched,
        )


def _switch(switched: dict[str, Any], limits: dict[str, Any], barebones: bool, overfit: int | float,
            dev_run: int) -> None:
    """What ``barebones``, ``overfit_batches`` and ``fast_dev_run`` override, in place."""
    if barebones:  # nothing that costs time per step besides the step itself
        switched.update(enable_logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)
    if overfit:  # the same first batches every epoch, for training and validation
        limits["train"] = limits["validate"] = overfit
    if dev_run:
        if not overfit:
            limits["train"] = limits["validate"] = dev_run
        limits["test"] = limits["predict"] = dev_run
        switched.update(max_steps=dev_run, max_epochs=1, num_sanity_val_steps=0, val_check_interval=None,
                        check_val_every_n_epoch=1, enable_logger=False)
