"""The Trainer: its arguments, its parts, and where each call runs.

``__init__`` resolves the arguments into frozen ``Settings`` and builds what every call shares:
accelerator, strategy (and its launcher), precision, callbacks, loggers, the ``RunState`` and
the logged metrics. Each call (``fit``, ``validate``, ``test``, ``predict``) runs here, or as
every rank of the workers its launcher starts (``launch(fn, *args)``, ``strategies/
launchers.py``): here it builds a ``Run`` (``setup.py``), restores a checkpoint into it, runs the
loop (``framework.loops``) inside the stop-signal handlers and the heartbeat, and tears down.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
from collections.abc import Callable
from typing import Any

import torch

from framework import loops
from framework.accelerators import get_accelerator
from framework.callbacks.base import Callback
from framework.checkpointing.file import wait_for_uploads_on_every_rank
from framework.checkpointing.parts import Stateful
from framework.data import DataModule
from framework.environments import DistInfo, detect_environment
from framework.errors import ConfigError
from framework.module import TrainModule
from framework.paths import forget_storage_settings, is_url, upload_in_background, use_storage_options
from framework.precision import Precision
from framework.profilers import Profiler, resolve_profiler
from framework.rank_zero import rank_zero_info
from framework.run_state.metrics import LoggedMetrics
from framework.run_state.state import RUNNING_STAGE, RunState
from framework.strategies import Strategy, create_strategy
from framework.strategies.launchers import as_launcher_worker
from framework.strategies.launchers.worker_failures import record_worker_error
from framework.trainer import arguments as args
from framework.trainer import checkpointing, reports, run_loggers, setup
from framework.trainer.controls import TrainerControls
from framework.trainer.data_properties import DataProperties
from framework.trainer.fit_loop_view import FitLoopView
from framework.trainer.heartbeat import Heartbeat
from framework.trainer.preemption import SignalCatcher, StopCheck, StoppedBySignal, save_after_signal
from framework.trainer.properties import TrainerProperties
from framework.trainer.run import Call, Run, one_datamodule, split_datamodule
from framework.trainer.settings import Settings
from framework.trainer.spawned_outcome import Outcome


class Trainer(TrainerProperties, DataProperties, TrainerControls):
    """Runs fit/validate/test/predict for a ``TrainModule``. Keyword names and meanings follow Lightning's.

    This signature is the one list of the Trainer's arguments: a recipe's ``trainer:`` keys are derived from it.

    Args:
        accelerator, devices, num_nodes: ``cpu``, ``cuda`` or ``auto`` (CUDA when available); devices per node (a
            number, a list of CUDA indices, or ``auto``); nodes in the job. ``devices * num_nodes`` is the world size.
        strategy: ``single``, ``dp``, ``ddp`` (NCCL on CUDA, else Gloo), ``ddp_gloo``, ``ddp_nccl``, ``fsdp``,
            ``model_parallel``, ``mpi``, ``ddp_spawn``, ``ddp_notebook`` or ``auto``; a mapping ``{name: ...,
            init_method: ..., timeout: ...}`` (a name and the strategy's options); or a ``Strategy``.
        precision: ``32-true`` (or ``32``), ``64-true``, ``bf16-mixed``, ``16-mixed``, ``bf16-true`` or ``16-true``.
        max_epochs, min_epochs, max_steps, min_steps, max_time: when to stop (``max_time``: seconds,
            ``"DD:HH:MM:SS"`` or ``{days, hours, minutes, seconds}``); 1000 epochs when none of the maxima is given.
        limit_{train,val,test,predict}_batches, overfit_batches: an int counts batches, a float is a fraction.
        val_check_interval: validate every N training batches (int) or fraction of an epoch (float).
        accumulate_grad_batches: step the optimizer every k batches (DDP skips the all-reduce on the k-1 others).
        gradient_clip_val, gradient_clip_algorithm: clip by ``norm`` (None: norm) or ``value``;
            ``configure_gradient_clipping`` receives both as given.
        callbacks, logger: a Callback or a list; ``logger``: ``True`` (TensorBoard), ``False``, a Logger or a list.
        enable_checkpointing, enable_progress_bar, enable_model_summary: add the default ModelCheckpoint, progress
            bar or ModelSummary unless one was given.
        default_root_dir: where logs and checkpoints go (default: the working directory): a folder, or an fsspec URL
            (``s3://bucket/run``, ``memory://run``; ``docs/guides/clouds/object-storage.md``).
        storage_options: fsspec's options (``key``, ``secret``, ``endpoint_url``, ``client_kwargs``, ...) for the
            buckets of this Trainer's URLs (``default_root_dir``, ModelCheckpoint ``dirpath``, a logger's ``save_dir``,
            PredictionWriter ``output_dir``, a ``ckpt_path``); without them the environment's (``AWS_*`` variables).
            They, and ``async_upload``, hold until the next Trainer is built (none of an earlier one's is kept).
        async_upload: upload the checkpoints written to those URLs in a background thread, in order, each index
            after its checkpoint: a save waits for the serialisation (and for the previous checkpoint's upload: one
            waits in memory at most); the fit waits for the uploads at its end, and ``save_checkpoint`` outside a fit
            before it returns. A failed upload is a ``CheckpointError`` naming its URL at the next save or the fit's
            end, whichever comes first. Sharded (FSDP) saves stay synchronous.
        use_distributed_sampler: shard every loader over the ranks (``False``: keep each loader's own sampler); a
            shuffled training loader follows one order for any number of ranks, one process included.
        on_nonfinite: a NaN or infinite loss ``error`` (the default: stop, naming the step), ``skip`` (drop that
            optimizer step on every rank) or ``warn``; no checkpoint with non-finite weights replaces a good one.
        preemption_signal, requeue: a signal that, as SIGTERM, stops a fit with a checkpoint (None: SIGTERM and
            Ctrl-C only); with ``requeue``, a SLURM job then requeues itself and resumes from that checkpoint.
        max_restarts, rdzv_endpoint: passed to the elastic agent when fw launches workers.
        activation_checkpointing_policy: submodule classes (or their names) whose activations are computed again in
            the backward instead of kept.
        compile: ``torch.compile`` the model's blocks (or the model) after the strategy wrapped it: ``True``, or a
            mapping of torch.compile's options and ``fallback``.
        profiler: ``simple``, ``advanced``, ``pytorch`` or a ``Profiler``: every hook timed, a report after each call.
        check_val_every_n_epoch, num_sanity_val_steps, log_every_n_steps, reload_dataloaders_every_n_epochs: as in
            Lightning.
        deterministic, benchmark, detect_anomaly, inference_mode, sync_batchnorm, fast_dev_run, barebones: as in Lightning.
    """

    def __init__(
        self, accelerator: str = "auto", strategy: Any = "auto", devices: Any = "auto", num_nodes: int = 1,
        precision: Any = "32-true", logger: Any = True, callbacks: list[Callback] | Callback | None = None,
        max_epochs: int | None = None, min_epochs: int | None = None, max_steps: int = -1, max_time: Any = None,
        limit_train_batches: int | float | None = None, limit_val_batches: int | float | None = None,
        limit_test_batches: int | float | None = None, limit_predict_batches: int | float | None = None,
        val_check_interval: int | float | None = None, check_val_every_n_epoch: int | None = 1,
        num_sanity_val_steps: int = 2, log_every_n_steps: int = 50, enable_checkpointing: bool = True,
        enable_progress_bar: bool = True, accumulate_grad_batches: int = 1, gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None, deterministic: bool = False,
        default_root_dir: str | None = None, max_restarts: int = 0, rdzv_endpoint: str | None = None,
        on_nonfinite: str = "error", preemption_signal: str | None = "SIGUSR1", requeue: bool = False,
        enable_model_summary: bool = True, fast_dev_run: int | bool = False, overfit_batches: int | float = 0.0,
        reload_dataloaders_every_n_epochs: int = 0, benchmark: bool | None = None, detect_anomaly: bool = False,
        inference_mode: bool = True, use_distributed_sampler: bool | None = None, sync_batchnorm: bool = False,
        barebones: bool = False, profiler: Any = None, activation_checkpointing_policy: Any = None,
        compile: Any = False, min_steps: int | None = None, storage_options: dict[str, Any] | None = None,
        async_upload: bool = False,
    ) -> None:
        arguments = {name: value for name, value in locals().items() if name in _SETTINGS}
        self.settings = Settings.resolve(**arguments)

        # where the run happens: accelerator, devices, strategy, and how its processes start
        self.accelerator = get_accelerator(accelerator)  #: Where the run computes: a CPU or CUDA ``Accelerator``.
        self.num_nodes = args.positive_int("num_nodes", num_nodes)
        self.environment = detect_environment()  #: Who started this process: torchrun, SLURM, MPI or local.
        self.devices = args.parse_devices(args.devices_for(devices, self.environment, self.accelerator),
                                          self.accelerator)
        self.strategy: Strategy = create_strategy(
            args.default_strategy(strategy, len(self.devices), self.num_nodes, self.environment), self.accelerator.name
        )
        self.strategy.check(devices, len(self.devices), self.num_nodes, self.environment)
        self.strategy.connect(self.accelerator, self._dist_info(), self.devices)
        self.strategy.sync_batchnorm = self.settings.sync_batchnorm
        self.launcher = self.strategy.launcher(self.environment, self.num_nodes, self.settings.max_restarts,
                                               self.settings.rdzv_endpoint)
        as_launcher_worker()
        self.precision_plugin = Precision(precision, self.accelerator.name)

        # the parts a run calls into, and what it produces
        self.callbacks = setup.default_callbacks(args.check_callbacks(args.as_list(callbacks)),
                                                 self.settings.enable_checkpointing, self.settings.enable_progress_bar,
                                                 self.environment)
        self.loggers = run_loggers.resolve_loggers(logger if self.settings.enable_logger else False)
        if self.settings.fast_dev_run and not self.settings.barebones:  # Lightning's: callbacks idle, logs nowhere
            self.loggers = run_loggers.dev_run_loggers(logger)
            n = self.settings.fast_dev_run
            rank_zero_info(f"fw: fast_dev_run={n}: {n} batch(es) per stage, without logging or checkpoints")
        forget_storage_settings()  # an earlier Trainer's options and async_upload are not this one's
        self._storage_options = storage_options  # also for a ckpt_path given to fit/validate/test/predict
        for url in (self.settings.default_root_dir, *(getattr(part, "dirpath", None) for part in self.callbacks),
                    *(getattr(part, "output_dir", None) for part in self.callbacks),
                    *(getattr(lg, "_save_dir", None) for lg in self.loggers)):
            use_storage_options(url, storage_options)  # the buckets of this Trainer's URLs
            if async_upload:
                upload_in_background(url)
        self.state = RunState()
        self.profiler: Profiler = resolve_profiler(profiler, self.settings.barebones)  # None: PassThroughProfiler
        self._no_metrics = LoggedMetrics()  # what the metric properties read before the first call
        #: the current or last call's ``Run`` (``run.py``), kept between calls as Lightning keeps its state
        self.run: Run | None = None
        self.last_fit: Run | None = None  # the last fit's Run, kept through validate, test and predict
        self.batch_counts: dict[str, list[int | float]] = {}  # batches per loader of the last validate/test/predict
        #: The user's own stateful objects, saved in (and restored from) every checkpoint of a fit.
        self.checkpoint_parts: dict[str, Stateful] = {}
        self.fit_loop = FitLoopView(self)  #: Lightning's ``trainer.fit_loop``: its progress and bounds.

    # -- public API -----------------------------------------------------------------------------
    def fit(self, model: TrainModule, train_dataloaders: Any = None, val_dataloaders: Any = None,
            datamodule: DataModule | None = None, ckpt_path: str | None = None) -> None:
        """Train ``model``; ``ckpt_path`` (a path, ``"last"`` or ``"best"``) resumes from a
        checkpoint. A DataModule may be given in place of ``train_dataloaders``, as in Lightning."""
        if isinstance(train_dataloaders, DataModule):
            train_dataloaders, datamodule = None, one_datamodule(train_dataloaders, datamodule)
        self._call(Call("fit", model, datamodule, {"train": train_dataloaders, "validate": val_dataloaders},
                        ckpt_path))

    def validate(self, model: TrainModule | None = None, dataloaders: Any = None, ckpt_path: str | None = None,
                 verbose: bool = True, datamodule: DataModule | None = None) -> list[dict]:
        """One pass over the validation data; the logged epoch values, one dict per loader
        (``verbose``: also shown as a table on stderr, rank 0)."""
        dataloaders, datamodule = split_datamodule(dataloaders, datamodule)
        return self._call(Call("validate", model, datamodule, {"validate": dataloaders}, ckpt_path, verbose=verbose))

    def test(self, model: TrainModule | None = None, dataloaders: Any = None, ckpt_path: str | None = None,
             verbose: bool = True, datamodule: DataModule | None = None) -> list[dict]:
        """One pass over the test data; as ``validate``."""
        dataloaders, datamodule = split_datamodule(dataloaders, datamodule)
        return self._call(Call("test", model, datamodule, {"test": dataloaders}, ckpt_path, verbose=verbose))

    def predict(self, model: TrainModule | None = None, dataloaders: Any = None,
                datamodule: DataModule | None = None, return_predictions: bool | None = None,
                ckpt_path: str | None = None) -> list | None:
        """``predict_step`` over the data: a list of outputs, a list of such lists for several
        loaders, or None with ``return_predictions=False``."""
        dataloaders, datamodule = split_datamodule(dataloaders, datamodule)
        keep = True if return_predictions is None else bool(return_predictions)
        return self._call(Call("predict", model, datamodule, {"predict": dataloaders}, ckpt_path,
                               return_predictions=keep))

    def init_module(self, empty_init: bool | None = None) -> contextlib.AbstractContextManager:
        """Lightning's ``with trainer.init_module(): model = Model()``: under ``fsdp`` the model is
        built on the meta device (no memory; ``empty_init=False`` builds it in memory) and made
        real shard by shard once sharded; under other strategies it is built as without it."""
        stack = contextlib.ExitStack()
        stack.enter_context(self.strategy.tensor_init_context(empty_init))
        stack.enter_context(self.precision_plugin.init_context())  # 64-true: layers made in float64
        return stack

    def save_checkpoint(self, filepath: str | os.PathLike, weights_only: bool = False,
                        storage_options: dict[str, Any] | None = None) -> None:
        """Write a checkpoint (call on every rank: rank 0 writes, the others wait). After a fit and
        then ``validate``, ``test`` or ``predict`` of the same model, the fit's (its optimizers,
        progress and data position as it ended) with the weights as they are now, as in Lightning
        (``weights_only``: Lightning's, ``trainer/weights_only.py``). ``filepath`` may be a URL
        (``s3://bucket/run/x.ckpt``), with fsspec's ``storage_options`` for its bucket."""
        if (run := self.run) is None:
            raise ConfigError("save_checkpoint: no model yet; call it during or after fit/validate/test")
        if storage_options is not None and not is_url(filepath):
            raise ConfigError(f"save_checkpoint('{os.fspath(filepath)}', storage_options=...): storage_options are "
                              "for a URL (s3://bucket/...); a local path takes none, drop them")
        use_storage_options(filepath, storage_options)
        fit = self.last_fit
        checkpointing.save(fit if fit is not None and fit.module is run.module else run, filepath, weights_only)
        if not (self.state.fn == "fit" and self.state.status == "running"):  # no fit waits for its upload: now
            wait_for_uploads_on_every_rank(self.strategy)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Send ``metrics`` to every logger (rank 0 only; other ranks do nothing), each then
        asked to ``save()``, as Lightning asks after every row."""
        if not self.is_global_zero or not metrics:
            return
        for lg in self.loggers:
            lg.log_metrics(metrics, step)
            lg.save()

    # -- orchestration --------------------------------------------------------------------------
    def _call(self, call: Call) -> Any:
        """Here, or as every rank of the workers the launcher starts: rank 0's outcome comes back
        and is applied here (``spawned_outcome.py``); fw's own launcher ends this process instead
        (``JobEnded``: its workers re-ran the whole program)."""
        setup.refuse_a_call_inside_another(self.state, call.fn)
        call = dataclasses.replace(call, ckpt_path=checkpointing.lightnings_default(
            call.fn, call.ckpt_path, call.model is not None, self))
        if isinstance(call.ckpt_path, (str, os.PathLike)) and is_url(call.ckpt_path):  # read with this Trainer's
            use_storage_options(call.ckpt_path, getattr(self, "_storage_options", None))
        if self.launcher is None:
            return self._run_here(call)
        model = call.model if call.model is not None else self.lightning_module
        outcome: Outcome = self.launcher.launch(self._run_in_worker, call)
        return outcome.apply(self, model) if model is not None else outcome.output

    def _run_in_worker(self, call: Call) -> Outcome:
        """In a worker a launcher started for this call: run it as the rank the launcher set."""
        self.launcher = None  # this process is one rank: its calls run here
        self.strategy.connect(self.accelerator, detect_environment().info(), self.devices)
        return Outcome.of(self, self._run_here(call))

    def _run_here(self, call: Call) -> Any:
        """Run ``call`` in this process, as one rank of the job."""
        fn = call.fn
        model = setup.checked_model(fn, call.model if call.model is not None else self.lightning_module)
        state = self.state
        state.fn, state.status, state.signal, state.stop_reason, state.lost_node = fn, "running", None, None, None
        state.stage = RUNNING_STAGE[fn]
        run: Run | None = None
        failed = False
        signals = None  # the fit's stop-signal handlers (trainer/preemption.py), once the ranks are known
        try:
            run = setup.new_run(self, fn, model, call.datamodule)
            resume_path = setup.setup(run, call.loaders, call.ckpt_path)
            run.return_predictions = call.return_predictions
            setup.restore(run, resume_path)
            reports.print_summary(run)
            signals = SignalCatcher(run) if fn == "fit" else None
            run.stop_check = StopCheck(run) if fn == "fit" else None
            with signals or contextlib.nullcontext(), Heartbeat(run), \
                    torch.autograd.set_detect_anomaly(True) if self.settings.detect_anomaly else \
                    contextlib.nullcontext():
                result = _LOOPS[fn](run)
                if signals is not None and state.stop_reason == "preempted":
                    signals.hold()  # a second signal waits for the checkpoint and the exit (until release)
            if fn == "fit" and state.stop_reason == "preempted":
                state.status = "interrupted"
                save_after_signal(run)
                wait_for_uploads_on_every_rank(run.strategy)
            else:
                if fn == "fit":
                    wait_for_uploads_on_every_rank(run.strategy)  # the fit's checkpoints are in the bucket first
                    reports.report_where_it_went(run)
                elif fn in ("validate", "test") and call.verbose and self.is_global_zero:
                    reports.print_results(fn, result)
        except BaseException as exc:
            failed = True
            state.status = "interrupted"
            if run is not None:
                run.hooks.callbacks("on_exception", exc)
                if run.datamodule is not None:
                    run.datamodule.on_exception(exc)
            record_worker_error(exc)
            self.strategy.on_exception(exc)
            raise
        finally:
            try:
                if run is not None:
                    setup.teardown(run, failed)
                else:
                    self.strategy.teardown()
                    state.stage = None
            finally:
                if signals is not None:
                    signals.release()
        if not failed and state.status == "running":  # after the teardown hooks, as in Lightning
            state.status = "finished"
        if fn == "fit" and state.stop_reason == "preempted":
            raise StoppedBySignal(0)  # with its state saved: a clean end of the program (preemption.py)
        return result

    def _dist_info(self) -> DistInfo:  # from the launcher around us, else fresh (one process, or fw starts them)
        if self.strategy.multi_process and self.environment.launched_externally:
            return self.environment.info()
        return DistInfo()


#: what each call runs once its set-up is done
_LOOPS: dict[str, Callable[[Run], Any]] = {"fit": loops.run_fit, "validate": loops.run_eval_stage, "test": loops.run_eval_stage,
          "predict": loops.run_predict}
#: the arguments that ``Settings`` resolves (the others build the Trainer's parts)
_SETTINGS = set(inspect.signature(Settings.resolve).parameters) - {"cls"}
