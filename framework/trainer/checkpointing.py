"""Checkpoints of a run: what ``save`` writes and how ``restore`` puts it back (where a
resumed fit continues, and which checkpoints it refuses, is ``resume.py`` beside this file).

A checkpoint holds the weights, optimiser and scheduler states, the GradScaler, the run's
progress (``RunState.progress()``, one piece), callback states, hyperparameters and every rank's
RNG states: the current ones and those at the start of the epoch. Resuming in the middle of an
epoch rebuilds that epoch's data order from the epoch-start RNG, draws (and drops) the batches
already trained on, then puts back the RNG state of the moment the checkpoint was written, so
the resumed run is bit for bit the run that was never stopped. That position is counted in
batches per rank, and in samples of the global order on another number of ranks or batch size
(``position_mapping.py``). The file format (atomic write, safe load) is ``framework/checkpointing/file.py``.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator, Sized
from typing import TYPE_CHECKING, Any

import torch

from framework.callbacks import ray_report
from framework.checkpointing import file as ckpt
from framework.checkpointing import search
from framework.checkpointing.optimizer_keys import numbered
from framework.checkpointing.parts import Callbacks, CheckpointParts, Each, OnLoad, Stateful, Value
from framework.checkpointing.single_file import is_live
from framework.checkpointing.weights_only import refuse_to_resume_from_weights_only, weights_only_parts
from framework.data.global_order import GlobalOrderSampler
from framework.environments.ray import RayTrainEnvironment
from framework.errors import CheckpointError, ConfigError, TrainingError
from framework.paths import storage_path
from framework.rank_zero import rank_zero_info, rank_zero_warn
from framework.strategies.ft.strategy import ReplicaGroup
from framework.strategies.launchers.rendezvous import elastic_job_id
from framework.trainer import end_of_fit, position_mapping
from framework.trainer.resume import position_parts, progress_part, resume_point
from framework.waiting import waiting_in

if TYPE_CHECKING:
    from framework.trainer.run import Run
    from framework.trainer.trainer import Trainer


# -- save -----------------------------------------------------------------------------------------
def save(run: Run, path: str | os.PathLike, weights_only: bool = False) -> None:
    """Write a checkpoint of ``run`` through its strategy (call on every rank); ``weights_only``:
    Lightning's (``weights_only.py``)."""
    strategy = run.strategy
    with run.hooks.profiled("save_checkpoint"), waiting_in(f"a checkpoint save of '{os.fspath(path)}'"):
        _refuse_nonfinite_weights(run, path, is_live(strategy))
        parts = parts_of(run, for_fit=True)
        path = storage_path(path, "save_checkpoint filepath")
        strategy.save_checkpoint(path, weights_only_parts(run, parts) if weights_only else parts)


def parts_of(run: Run, for_fit: bool, path: str = "", on_read: Callable[[dict], None] | None = None,
             resumed: dict | None = None) -> CheckpointParts:
    """The run as the parts of a checkpoint (``parts.py``), in load order. For a fit all of
    them; else the weights, the DataModule's state and the callbacks' (as Lightning restores
    them). ``on_read`` runs before any part loads (the refusals, ``on_load_checkpoint``);
    ``resumed`` receives this rank's per-rank parts."""
    module, state = run.module, run.state
    shared: dict[str, Stateful | OnLoad] = {}
    if on_read is not None:
        shared["fw/on_read"] = OnLoad(on_read)
    shared["state_dict"] = Value(module.state_dict, lambda weights: _load_weights(module, weights, path))
    if run.datamodule is not None:
        shared[type(run.datamodule).__qualname__] = run.datamodule
    parts = CheckpointParts(shared=shared, values=_values(run))
    if not for_fit:  # the callbacks' states too, as Lightning restores them for evaluation and predict
        shared.update(_callback_parts(run))
        return parts
    renamed = functools.partial(numbered, module=module, path=path)  # an FSDP checkpoint's names
    shared["optimizer_states"] = Each(run.optimizers, "optimizer", path, prepare=renamed)
    shared["lr_schedulers"] = Each([cfg.scheduler for cfg in run.lr_scheduler_configs], "LR scheduler", path)
    shared["precision"] = run.precision
    shared.update(_callback_parts(run))
    shared.update(run.trainer.checkpoint_parts)  # the user's own
    shared["loop"] = progress_part(state, run.metrics)
    parts.per_rank = position_parts(run, resumed if resumed is not None else {})
    parts.on_write = lambda checkpoint: _on_save_hooks(run, checkpoint)
    end_of_fit.use(run.end_of_fit, parts)  # after a distributed fit: every rank's states, as it ended
    return parts


def _callback_parts(run: Run) -> dict[str, Stateful | OnLoad]:
    """The callbacks' ``on_load_checkpoint``, then their states (``load_state_dict``)."""
    hooks = run.hooks
    return {"fw/callback_hooks": OnLoad(lambda checkpoint: hooks.callbacks("on_load_checkpoint", checkpoint)),
            "callbacks": Callbacks(run.callbacks)}


def _values(run: Run) -> dict[str, Any]:
    state = run.state
    return {
        "fw_format": ckpt.FORMAT_VERSION,
        "epoch": state.epoch,
        "global_step": state.global_step,
        "hyper_parameters": ckpt.plain_hparams(getattr(run.module, "hparams", {}) or {}, keep_types=True),
        "world_size": run.strategy.world_size,
        "data_ranks": run.strategy.data_parallel_size,  # fewer under tensor parallelism (position_mapping.py)
        "train_batch_size": position_mapping.train_batch_size(run),  # the unit of a mid-epoch position ("loop")
        "train_order": position_mapping.train_order(run),  # what that position means in samples (position_mapping.py)
        # a restarted (elastic) or requeued (SLURM) job looks for its own checkpoints by these
        "run_id": state.run_id,
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "fit_index": state.fit_index,
        **_datamodule_hparams(run),
    }


def _datamodule_hparams(run: Run) -> dict[str, Any]:
    """A DataModule's ``save_hyperparameters`` values, under Lightning's key (when it has any)."""
    datamodule = run.datamodule
    if datamodule is None or not datamodule.hparams:
        return {}
    return {datamodule.CHECKPOINT_HYPER_PARAMS_KEY: ckpt.plain_hparams(datamodule.hparams, keep_types=True)}


def _on_save_hooks(run: Run, checkpoint: dict) -> None:
    """The callbacks' ``on_save_checkpoint``, then the module's (Lightning's order); a
    DataModule with nothing to save leaves no entry."""
    if run.datamodule is not None and not checkpoint.get(type(run.datamodule).__qualname__):
        checkpoint.pop(type(run.datamodule).__qualname__, None)
    run.hooks.callbacks("on_save_checkpoint", checkpoint)
    run.hooks.module_hook("on_save_checkpoint", checkpoint)


def _load_weights(module: torch.nn.Module, weights: dict, path: str) -> None:
    try:
        module.load_state_dict(weights, strict=getattr(module, "strict_loading", True))
    except RuntimeError as err:
        raise CheckpointError(f"checkpoint '{path}' does not fit this model: {ckpt.state_dict_mismatch(err)}") from None


def _refuse_nonfinite_weights(run: Run, path: str | os.PathLike, live: bool) -> None:
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


# -- restore --------------------------------------------------------------------------------------
def resolve_path(run: Run, ckpt_path: Any, restarts: int) -> str | None:
    """The checkpoint file a run starts from: ``ckpt_path`` itself; for ``"last"`` that fit's
    newest ``last*.ckpt`` on a Trainer that ran a fit here (Lightning's), on a fresh one the
    newest ``last*.ckpt`` or checkpoint of the latest run (``fw test ckpt_path=last``); or, in a
    restarted or requeued job's fit, its own newest checkpoint
    (``restarts``: the elastic agents' restarts so far, as the ranks agreed at set-up)."""
    fn, trained_here = run.fn, run.state.fit_index > 0  # this Trainer ran a fit in this process
    if fn == "fit":
        run.state.fit_index = _count_fit()
        run.state.run_id = elastic_job_id()
    if fn == "fit" and isinstance(run.trainer.environment, RayTrainEnvironment):
        # Ray Train restarted the workers, or a run of the same name: its last reported checkpoint
        # is newer than any ckpt_path the loop gives (the loop runs again as it was written); only
        # the fit of the program that reported it resumes from it
        found = ray_report.checkpoint_to_resume(run.strategy.global_rank, run.state.fit_index)
        if found is not None:
            return found
    if ckpt_path is None and fn == "fit":
        return _checkpoint_to_restart_from(run, restarts)
    if ckpt_path == "best":
        return _best(run)
    if ckpt_path == "last":
        dirs = [getattr(cb, "dirpath", None) for cb in run.callbacks]
        if trained_here:
            return _own_last(run, dirs)
        found = search.find_last_checkpoint(dirs, run.settings.default_root_dir)
        if found is None and fn != "fit":  # scoring fresh weights is never what "last" asked for
            raise CheckpointError(f"ckpt_path='last': no checkpoint under {run.settings.default_root_dir}; fit first, or "
                                  "give ckpt_path=PATH")
        if found is None:
            rank_zero_warn(f"ckpt_path='last': no checkpoint under {run.settings.default_root_dir}; starting fresh "
                           "(give ckpt_path=PATH to resume a checkpoint kept elsewhere)")
        return found
    return None if ckpt_path is None else str(ckpt_path)


def _own_last(run: Run, dirs: list[str | None]) -> str | None:
    """``"last"`` on a Trainer that ran a fit here, Lightning's rule: the newest ``last*.ckpt`` in
    its ModelCheckpoints' folders, else (with Lightning's warning) the weights in memory; never
    an older top-k file of the fit, nor a checkpoint elsewhere under ``default_root_dir``."""
    found = search.newest_last_checkpoint(dirs)
    if found is None:
        rank_zero_warn(f'{run.fn}(ckpt_path="last"): this Trainer\'s fit saved no last checkpoint (last*.ckpt); '
                       "using the weights in memory, as Lightning does (ModelCheckpoint(save_last=True) saves one)")
    return found


def lightnings_default(fn: str, ckpt_path: Any, model_given: bool, trainer: Trainer) -> Any:
    """Lightning's rule for ``validate``/``test``/``predict`` called without a model and without
    ``ckpt_path`` on a Trainer that has run one: the best checkpoint of this Trainer's fit (with
    Lightning's warning), and an error where it has none, never the weights left in memory. A
    path given is checked before anything is created (``paths.py``: no ``s3://``)."""
    if isinstance(ckpt_path, (str, os.PathLike)) and ckpt_path not in ("last", "best"):
        return storage_path(ckpt_path, "ckpt_path")
    if fn == "fit" or model_given or ckpt_path is not None or trainer.lightning_module is None:
        return ckpt_path
    callback = trainer.checkpoint_callback
    best = callback.best_model_path if callback is not None else ""
    if not best:
        raise ConfigError(f"trainer.{fn}() without a model runs the best checkpoint of this Trainer's fit, as in "
                          "Lightning, but no ModelCheckpoint of this Trainer recorded one: pass the model "
                          f"(trainer.{fn}(model, ...)) to use the weights in memory, or ckpt_path=PATH")
    rank_zero_warn(f"trainer.{fn}() without a model uses the best checkpoint of the previous fit ({best}), as in "
                   "Lightning; pass ckpt_path='best' or 'last' to choose, or the model to use the weights in memory")
    return best


def _best(run: Run) -> str:
    """``ckpt_path="best"``: this Trainer's ModelCheckpoint's best, else the best one recorded in
    the newest checkpoint of an earlier run under the same folders (``fw fit``, then ``fw test
    ckpt_path=best``); never an older file or the weights in memory."""
    best = run.trainer.checkpoint_callback.best_model_path if run.trainer.checkpoint_callback is not None else ""
    if best:
        return best
    dirs = [getattr(cb, "dirpath", None) for cb in run.callbacks]
    found = search.best_recorded_under(dirs, run.settings.default_root_dir)
    if found is None:
        raise CheckpointError(f"ckpt_path='best': no ModelCheckpoint of this Trainer or of a run under "
                              f"{run.settings.default_root_dir} recorded a best checkpoint (no fit yet, or no save "
                              "point was reached: with check_val_every_n_epoch != 1 or val_check_interval != 1.0 it "
                              "saves after validation); fit with one first, or give ckpt_path=PATH")
    rank_zero_info(f"fw: ckpt_path='best': {found[0]}, the best that {found[1]} recorded")
    return found[0]


def restore(run: Run, ckpt_path: str | None) -> None:
    """Load weights (and for fit, everything else) from ``ckpt_path`` (see ``resolve_path``);
    for fit, leave the point to continue from in ``run.state.position.resume_from``."""
    fn, state = run.fn, run.state
    state.ckpt_path = ckpt_path
    if ckpt_path is None:
        return

    carry: list[position_mapping.Carry | None] = [None]

    def on_read(checkpoint: dict) -> None:
        if fn == "fit":  # before anything is loaded: a refused resume leaves the model as it was
            refuse_to_resume_from_weights_only(checkpoint, ckpt_path)
            carry[0] = position_mapping.check_position_carries_over(run, checkpoint, ckpt_path)
            position_mapping.continue_order(run, checkpoint)
        run.hooks.module_hook("on_load_checkpoint", checkpoint)

    mine: dict[str, Any] = {}
    parts = parts_of(run, for_fit=fn == "fit", path=ckpt_path, on_read=on_read, resumed=mine)
    try:
        checkpoint = run.strategy.load_checkpoint(ckpt_path, parts)
    finally:
        ray_report.drop_downloaded_copies()  # a copy of Ray's checkpoint, loaded: no longer needed
    rank_zero_info(f"fw {fn}: loaded {ckpt_path} (step {checkpoint.get('global_step')})")  # all of it fitted
    if fn == "fit":
        state.position.resume_from = resume_point(run, mine, ckpt.ranks_that_wrote(checkpoint), carry[0])


def join_replicas(run: Run) -> None:
    """A fit under ``ft`` meets the other replica groups here, after any checkpoint was loaded; a
    replica behind its live peers (restarted after a loss) is restored from a peer's state as from
    a checkpoint: weights, optimizer, progress, data position, bit for bit."""
    if run.fn != "fit":
        return
    if isinstance(run.strategy, ReplicaGroup):  # ``ft``, ``ft_fsdp``
        _refuse_data_replicas_cannot_share(run)

    def save() -> dict:  # this rank's state, as a checkpoint of one rank holds it
        parts = parts_of(run, for_fit=True)
        return parts.assemble([parts.rank_states()])

    def load_in_place(checkpoint: dict) -> None:  # in the middle of a fit, at the same batch: no position to move
        parts = parts_of(run, for_fit=True)
        parts.per_rank = {}
        asked = run.state.should_stop, run.state.stop_reason  # this replica's own stop request stays (``ft`` agrees it)
        parts.load(checkpoint, 0, 1, (0, 1))
        run.state.should_stop, run.state.stop_reason = asked

    def facts() -> dict[str, float]:  # what every replica group must share (``ft`` compares them at each commit)
        settings, train = run.settings, (run.loaders.get("train") or [None])[0]
        dataset, source = getattr(train, "dataset", None), run.loader_source

        def number(value: Any) -> float:
            return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else -1.0

        return {"batch size": number(getattr(train, "batch_size", None)),
                "dataset length": number(len(dataset)) if isinstance(dataset, Sized) else -1.0,
                "batches an epoch": number(run.num_training_batches),
                "limit_train_batches": number(settings.limits["train"]), "max_steps": float(settings.max_steps),
                "max_epochs": float(settings.max_epochs), "accumulate_grad_batches": float(settings.accumulate_grad_batches),
                "data seed": number(source.seed if source is not None else None)}

    def folders() -> list[str]:  # where this replica writes (``ft`` refuses a folder two replicas share)
        found = [run.log_dir, *(getattr(logger, "log_dir", None) for logger in run.loggers),
                 *(getattr(callback, "dirpath", None) for callback in run.callbacks)]
        return [os.fspath(folder) for folder in found if isinstance(folder, str | os.PathLike)]

    peer = run.strategy.join_replicas(save, load_in_place, run.state.global_step, not run.module.automatic_optimization,
                                      run.settings.on_nonfinite, facts, folders)
    if peer is not None:
        restore(run, peer)


def _refuse_data_replicas_cannot_share(run: Run) -> None:
    """Under ``ft`` every replica group reads its share of fw's one global order, so that the data
    position (epoch, global batches done) is the same on every replica and a checkpoint's is every
    replica's. A training loader fw does not put in that order (``use_distributed_sampler=False``,
    an iterable data set, a custom batch sampler or DistributedSampler, which would shard it inside
    the group only), or one with its own state (``state_dict``: each replica's would be its own,
    and a checkpoint holds the writer group's alone), cannot be kept so: refused."""
    loader = (run.loaders.get("train") or [None])[0]
    if loader is None:
        return
    if not run.settings.use_distributed_sampler:
        raise ConfigError("trainer.use_distributed_sampler=false cannot be used with trainer.strategy="
                          f"{run.strategy.name}: every "
                          "replica group would read the whole training loader; leave it true (each group reads its "
                          "share of fw's global order)")
    if callable(getattr(loader, "state_dict", None)):
        raise ConfigError(f"trainer.strategy={run.strategy.name} cannot keep the position of a stateful training loader "
                          f"({type(loader).__name__} has state_dict()): each replica group's state would be its own and "
                          "a checkpoint holds one group's; use a torch DataLoader over a map-style data set (fw keeps "
                          "its position in its global order, the same on every group)")
    if not isinstance(getattr(loader, "sampler", None), GlobalOrderSampler):
        raise ConfigError(f"trainer.strategy={run.strategy.name} needs a training loader fw can split over the replica groups: "
                          f"{_what_loader(loader)} is read as it is, the same on every group; use a torch DataLoader "
                          "over a map-style data set with its own batch_size (no batch_sampler or DistributedSampler)")


def _what_loader(loader: Any) -> str:
    dataset = getattr(loader, "dataset", None)
    if isinstance(dataset, torch.utils.data.IterableDataset):
        return f"a loader over an iterable data set ({type(dataset).__name__})"
    batches, sampler = getattr(loader, "batch_sampler", None), getattr(loader, "sampler", None)
    if batches is not None and type(batches) is not torch.utils.data.BatchSampler:
        sampler = batches
    return f"{type(loader).__name__} with {type(sampler).__name__}" if sampler is not None else type(loader).__name__


_fits_in_this_process = 0


def _count_fit() -> int:
    """Which fit of this program this is (1, 2, ...): a restarted program runs the same fits in
    the same order, so a pretraining fit resumes from its own checkpoints, not a later fit's."""
    global _fits_in_this_process
    _fits_in_this_process += 1
    return _fits_in_this_process


@contextlib.contextmanager
def fits_not_counted() -> Iterator[None]:
    """Fits run inside (the Tuner's) leave the count as it was: the fits after them keep the
    index they have without them, so a restarted program finds their checkpoints whether or not
    it tunes again."""
    global _fits_in_this_process
    before = _fits_in_this_process
    try:
        yield
    finally:
        _fits_in_this_process = before


def _checkpoint_to_restart_from(run: Run, restarts: int) -> str | None:
    """In a worker that the elastic agent restarted (``TORCHELASTIC_RESTART_COUNT`` > 0), or in
    a SLURM job that was requeued (``SLURM_RESTART_COUNT`` > 0), the newest checkpoint this run
    wrote before: rank 0 looks, every rank takes its answer. A first attempt resumes nothing."""
    env = os.environ
    if restarts and env.get("TORCHELASTIC_RUN_ID"):
        key, value, who = "run_id", run.state.run_id, "workers restarted by the elastic agent"
        count = str(restarts)
    elif int(env.get("SLURM_RESTART_COUNT") or 0) and env.get("SLURM_JOB_ID"):
        key, value, who = "slurm_job_id", env["SLURM_JOB_ID"], f"SLURM job {env['SLURM_JOB_ID']} requeued"
        count = env["SLURM_RESTART_COUNT"]
    else:
        return None
    path = None
    if run.strategy.is_global_zero:
        dirs = [getattr(cb, "dirpath", None) for cb in run.callbacks] + [run.settings.default_root_dir]
        path = search.newest_checkpoint_of_run(dirs, {key: value, "fit_index": run.state.fit_index})
    if run.strategy.is_distributed:
        path = run.strategy.broadcast(path)
    where = f"resuming from {path}" if path else "no checkpoint of this run was found, starting from scratch"
    rank_zero_info(f"fw: {who} (restart {count}): {where}")
    return path
