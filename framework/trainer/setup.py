"""What a run builds before its loop starts, and what it releases at the end.

``setup``: the process group and device, the data (``prepare_data`` on local rank 0, then
``setup(stage)`` of the DataModule, the callbacks and the module, then ``configure_model``, then
every loader sharded for this rank), the loggers and the run directory, the hook dispatcher,
the wrapped model and the optimisers. ``teardown``: the hooks, the loggers,
the strategy (process group), the loaders' workers and the last batch, and every process-wide
setting the run changed, put back.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch

from framework.callbacks.base import Callback
from framework.compile import compile_model
from framework.data import DataModule
from framework.data.run_loaders import LOADER_METHODS, LoaderSource
from framework.errors import ConfigError
from framework.loops.batches import refuse_a_fraction_of_no_batch
from framework.loops.hooks import overrides
from framework.loops.training_step import check_one_optimizer
from framework.module import TrainModule
from framework.optim import parse_optimizers
from framework.parallel.activation_checkpointing import checkpoint_activations, one_policy
from framework.profilers import timing
from framework.rank_zero import rank_zero_warn
from framework.seed import isolated_rng, sampler_seed
from framework.trainer import agreement, checkpointing, end_of_fit, run_loggers
from framework.trainer import arguments as args
from framework.trainer.lightning_differences import note_differences
from framework.trainer.run import Run

if TYPE_CHECKING:
    from framework.environments import ClusterEnvironment
    from framework.run_state.state import RunState
    from framework.trainer.settings import Settings
    from framework.trainer.trainer import Trainer



# -- construction-time helpers --------------------------------------------------------------------
def default_callbacks(callbacks: list, enable_checkpointing: bool, enable_progress_bar: bool,
                      environment: ClusterEnvironment | None = None) -> list:
    """The callbacks given, with the defaults that are switched on; in a Ray Train worker also
    ``RayTrainReport`` unless one is given (a checkpoint with each report where checkpointing is on)."""
    from framework.callbacks import ModelCheckpoint, RichProgressBar
    from framework.callbacks.ray_report import RayTrainReport
    from framework.environments.ray import RayTrainEnvironment

    callbacks = list(callbacks)
    for off, kind, name in ((not enable_checkpointing, ModelCheckpoint, "enable_checkpointing"),
                            (not enable_progress_bar, RichProgressBar, "enable_progress_bar")):
        given = next((c for c in callbacks if isinstance(c, kind)), None)
        if off and given is not None:  # Lightning refuses it too: the callback would be dropped unseen
            raise ConfigError(f"trainer.{name}=false, but the callbacks hold a {type(given).__name__}: remove it, "
                              f"or set trainer.{name}=true to use it")
    if enable_checkpointing and not any(isinstance(c, ModelCheckpoint) for c in callbacks):
        callbacks.append(ModelCheckpoint())
    if enable_progress_bar and not any(isinstance(c, RichProgressBar) for c in callbacks):
        callbacks.append(RichProgressBar())
    if isinstance(environment, RayTrainEnvironment) and not any(isinstance(c, RayTrainReport) for c in callbacks):
        callbacks.append(RayTrainReport(checkpoint=enable_checkpointing))
    # checkpointing runs last so it sees what early stopping and others decided
    return sorted(callbacks, key=lambda c: isinstance(c, ModelCheckpoint))


# -- set-up ---------------------------------------------------------------------------------------
def refuse_a_call_inside_another(state: RunState, fn: str) -> None:
    """A Trainer runs one call at a time: one made from a hook or callback of another would
    replace the running call's parts under it (Lightning fails an assertion there)."""
    if state.stage is not None:
        raise ConfigError(f"trainer.{fn}() was called while trainer.{state.fn}() runs (stage '{state.stage}', from "
                          f"a hook or callback): a Trainer runs one call at a time; call {fn}() after {state.fn}() "
                          "returns, or on a second Trainer")


def checked_model(fn: str, model: Any) -> TrainModule:
    """The call's model; refused when there is none or it is not a TrainModule."""
    if model is None:
        raise ConfigError(f"trainer.{fn}() needs a model")
    if not isinstance(model, TrainModule):
        raise ConfigError(f"trainer.{fn}(): the model is a {type(model).__module__}.{type(model).__qualname__}, "
                          "not a TrainModule; subclass framework.TrainModule (training_step, configure_optimizers)")
    return model


def new_run(trainer: Trainer, fn: str, model: TrainModule, datamodule: DataModule | None) -> Run:
    """The call's ``Run``, with the process settings it asks for applied: from here on
    ``teardown`` releases what set-up takes, whatever fails."""
    _check_methods(model, fn)
    configure_callbacks = timing.timed(timing.active(trainer.profiler),  # before the run's dispatcher exists
                                       f"[LightningModule]{type(model).__name__}.configure_callbacks",
                                       model.configure_callbacks)
    callbacks = _with_model_callbacks(trainer.callbacks, configure_callbacks())
    run = Run.of(trainer, fn, model, callbacks, datamodule)
    trainer.callbacks = run.callbacks  # configure_callbacks() replaces them for good, as in Lightning
    run.make_current()
    run.process_settings = _apply_process_settings(trainer.settings)
    return run


def setup(run: Run, loaders: dict, ckpt_path: Any) -> str | None:
    """Process group, data, loggers, the wrapped model and (for fit) the optimisers; returns the
    checkpoint to start from (see ``checkpointing.resolve_path``): a resumed run logs into the
    version folder its checkpoint came from."""
    fn, trainer, model, datamodule = run.fn, run.trainer, run.module, run.datamodule
    strategy, settings = run.strategy, run.settings
    strategy.setup_environment()
    model.trainer = trainer
    if datamodule is not None:
        datamodule.trainer = trainer
    hooks = run.hooks
    if strategy.local_rank == 0:  # downloads and files: once per node
        if datamodule is not None:
            hooks.datamodule_hook(datamodule, "prepare_data")
        hooks.module_hook("prepare_data")
    agreed = agreement.agree(run)  # every rank waits here for the others (the data is there)
    if datamodule is not None:
        hooks.datamodule_hook(datamodule, "setup", fn)
    resume_path = checkpointing.resolve_path(run, ckpt_path, agreed.restarts)
    run_loggers.setup_loggers(run, resume_path, agreed.root_error)  # the run directory, which the callbacks' setup may use
    timing.start_run(run)  # the profiler's stage, rank and folder (its report is written at teardown)
    hooks.callbacks("setup", stage=fn)  # Lightning's order: the DataModule, the callbacks, the module
    hooks.module_hook("setup", fn)
    with run.precision.init_context(), strategy.model_building_context():  # 64-true: the layers it makes are float64
        hooks.module_hook("configure_model")
    policy, key = one_policy(settings.activation_checkpointing, strategy.activation_checkpointing_policy)
    checkpoint_activations(model, policy, key)  # before the strategy wraps or shards the model
    run.metrics.strategy = strategy if strategy.is_distributed else None
    source = datamodule if datamodule is not None else model  # Lightning: the module's own *_dataloader()
    run.loader_source = LoaderSource(
        given=loaders, source=source, seed=sampler_seed(), overfit=bool(settings.overfit_batches),
        shard=strategy.distributed_sampler_kwargs() if settings.use_distributed_sampler else None,
        eval_shard=strategy.evaluation_sampler_kwargs() if settings.use_distributed_sampler else None,
        ordered=settings.use_distributed_sampler, profiler=hooks.profiler, stacks=strategy.is_distributed)
    wanted = [key for key, given in loaders.items()
              if given is not None or datamodule is not None or _defines_loader(model, key)]
    made = {key: _loaders(run, key) if _needs_loader(run, key, loaders[key], source) else []
            for key in sorted(wanted, key=lambda key: key != "validate" or settings.num_sanity_val_steps == 0)}
    run.loaders = {key: made[key] for key in wanted}
    run.keep_batch_counts()
    for key, stage_loaders in run.loaders.items():
        for loader in stage_loaders:
            refuse_a_fraction_of_no_batch(loader, settings.limits[key], key)
    run.precision.convert_module(model)
    strategy.setup_module(model)
    compiled = compile_model(model, settings.compile, strategy.compile_units(model), strategy.root_device.type)
    if fn == "fit":
        run.optimizers, run.lr_scheduler_configs = parse_optimizers(hooks.module_fn("configure_optimizers")())
        strategy.check_optimizers(run.optimizers)
        if compiled is not None:
            compiled.after_first_step(run.optimizers)
        if model.automatic_optimization:
            check_one_optimizer(run.optimizers)
    return resume_path


def restore(run: Run, resume_path: str | None) -> None:
    """The checkpoint loaded (``checkpointing.restore``), then the loggers' first write: nothing
    is created in the run folder before every check of set-up has passed. Then the notes where fw
    differs from Lightning, which a run refused at set-up does not print before its error."""
    checkpointing.restore(run, resume_path)
    checkpointing.join_replicas(run)
    run_loggers.log_hyperparameters(run)
    note_differences(run, resume_path)


#: Lightning hooks fw does not call, with what to do instead: an override is refused, never ignored
_NOT_CALLED = {
    "configure_sharded_model": "it is Lightning's deprecated hook; build the layers in configure_model() instead",
}


def _check_methods(model: TrainModule, fn: str) -> None:
    """Refuse a hook fw would not call, and (for fit) a module without the two methods it needs."""
    for name, instead in _NOT_CALLED.items():
        if callable(getattr(type(model), name, None)):
            raise ConfigError(f"{type(model).__name__}.{name}() is overridden but fw does not call it: {instead}")
    for name, example in _FIT_NEEDS.items():
        if fn == "fit" and getattr(type(model), name) is getattr(TrainModule, name):
            raise ConfigError(f"{type(model).__name__} has no {name}(): fit needs one, e.g. {example}")


_FIT_NEEDS = {
    "training_step": "def training_step(self, batch, batch_idx): return the loss",
    "configure_optimizers": "def configure_optimizers(self): return torch.optim.Adam(self.parameters(), lr=1e-3)",
}


def _with_model_callbacks(callbacks: list[Callback], extra: Any) -> list[Callback]:
    """``configure_callbacks()``'s ``extra``: each replaces the Trainer's callbacks of its type (Lightning's rule)."""
    from framework.callbacks import ModelCheckpoint

    extra = args.check_callbacks(args.as_list(extra)) if extra else []
    if not extra:
        return callbacks
    types = {type(cb) for cb in extra}
    kept = [cb for cb in callbacks if type(cb) not in types]
    return sorted(kept + extra, key=lambda c: isinstance(c, ModelCheckpoint))


def _defines_loader(model: TrainModule, key: str) -> bool:
    return overrides(model, TrainModule, LOADER_METHODS[key])


def _loaders(run: Run, key: str) -> list:
    """The stage's loaders. A fit that runs the sanity check asks for its validation loaders
    first, with the random streams left as they were, as Lightning does (it asks for them inside
    the sanity check, whose streams it isolates, before the training loader): a
    ``val_dataloader()`` that draws random data draws what it draws under Lightning, and the
    training data after it too. (Without the sanity check Lightning asks for them at the first
    validation, fw still at the start: docs/lightning.md, "Where fw deliberately differs".)"""
    assert run.loader_source is not None, "set just before"
    if run.fn != "fit" or key != "validate" or run.settings.num_sanity_val_steps == 0:
        return run.loader_source.loaders(key)
    with isolated_rng():
        return run.loader_source.loaders(key)


def _needs_loader(run: Run, key: str, given: Any, source: Any) -> bool:
    """Fit asks for a validation loader only when it validates: the module has a
    ``validation_step`` and ``limit_val_batches`` is not 0, as in Lightning (which skips the
    loop, sanity check included, otherwise, and never asks for the loader)."""
    if run.fn != "fit" or key != "validate":
        return True
    if run.settings.limits["validate"] == 0:
        return False
    model = run.module
    if overrides(model, TrainModule, "validation_step"):
        return True
    base = DataModule if isinstance(source, DataModule) else TrainModule
    if given is not None or overrides(source, base, "val_dataloader"):
        rank_zero_warn(f"validation data was given but {type(model).__name__} has no validation_step: "
                       "fit skips validation (define validation_step to validate)")
    return False


def _apply_process_settings(settings: Settings) -> tuple[bool, str | None, bool]:
    """Set what ``deterministic`` asks for; the values before, for teardown to put back, so
    that a later Trainer in the same process starts from a clean slate."""
    before = (torch.are_deterministic_algorithms_enabled(), os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
              torch.backends.cudnn.benchmark)
    if settings.deterministic:
        torch.use_deterministic_algorithms(True)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    if settings.benchmark is not None:
        torch.backends.cudnn.benchmark = settings.benchmark
    return before


def _restore_process_settings(saved: tuple | None) -> None:
    if saved is None:
        return
    deterministic, cublas, benchmark = saved
    if torch.are_deterministic_algorithms_enabled() != deterministic:  # only if changed: the call imports
        torch.use_deterministic_algorithms(deterministic)  # torch._inductor (3 CPU-s a process, TorchDynamo's import)
    torch.backends.cudnn.benchmark = benchmark
    if cublas is None:
        os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    else:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = cublas


# -- teardown -------------------------------------------------------------------------------------
def teardown(run: Run, failed: bool = False) -> None:
    """After a failure the ``teardown`` hooks are not called, as in Lightning (``on_exception``
    was); the loggers, the process group, the process settings, the loaders' worker processes
    and the last batch are released either way. The Run stays readable (the Trainer's
    properties answer from it) but holds no live part."""
    fn = run.fn
    try:
        if not failed and fn == "fit":
            end_of_fit.keep(run, checkpointing.parts_of(run, for_fit=True))
        if not failed:
            run.hooks.callbacks("teardown", stage=fn)  # by name, as Lightning passes it
            if run.datamodule is not None:
                run.hooks.datamodule_hook(run.datamodule, "teardown", fn)
            run.hooks.module_hook("teardown", fn)
        if run.strategy.is_global_zero:
            for lg in run.loggers:
                lg.finalize("failed" if failed else "success")
        timing.end_run(run, failed)  # the profiler's report (Lightning's place: after the loggers)
    finally:
        run.strategy.teardown()
        run.release()
        _restore_process_settings(run.process_settings)
        run.process_settings, run.manual = None, None
        run.state.stage = None  # ``fn`` stays the last call's, as in Lightning
        run.metrics.strategy = None
