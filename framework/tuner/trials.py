"""``Trials``: the Tuner's own calls on the user's Trainer, and everything they change put back.

Lightning's finders run inside the user's ``fit``: at ``on_fit_start`` they save a checkpoint,
swap the callbacks for their own and the logger for a dummy, set ``max_steps`` and the limits,
run the loop, then restore the checkpoint and the settings. fw's Tuner does the same from the
outside, through the Trainer's own calls and its named methods for trials (``keep_parts``,
``lend_parts``, ``restore_parts``: ``trainer/controls.py``): each trial is a real ``trainer.fit`` (or ``validate``,
``test``, ``predict``) with

- the tuner's callbacks only (the Trainer's and the module's ``configure_callbacks()`` are left
  out, as Lightning's finder replaces every callback) and, where the Trainer has loggers, one
  that keeps nothing (Lightning's ``DummyLogger``): no log version is used, no hyperparameters
  are logged, no checkpoint is written;
- the settings it asks for on top of the Trainer's, without the sanity check (Lightning's
  finders run before it), ``max_time``, the summary and the progress bar, and with non-finite
  losses let through (``on_nonfinite="warn"``: a diverging sweep records them, as Lightning's);
- a fresh ``trainer.state`` (step 0, epoch 0), and a ``default_root_dir`` of its own, a
  temporary folder removed afterwards: a restarted or requeued job's trial never resumes the
  job's checkpoints, and whatever a trial writes goes with the folder;
- the fw logger at WARNING: a trial's summary lines would bury the tuner's own.

Afterwards the module has its weights (and buffers) as they were when the first trial had set
it up (after ``configure_model``, as Lightning's checkpoint at ``on_fit_start`` holds them), and
the Trainer its settings, callbacks, loggers, state and what it keeps between calls (``run``,
``last_fit``, ``batch_counts``); the random streams, the GradScaler's and the DataModule's state
are as before, and the program's count of fits too.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch

from framework.callbacks.base import Callback
from framework.loggers.base import Logger, NoExperiment
from framework.rank_zero import library_logger
from framework.seed import get_rng_state, set_rng_state
from framework.trainer.checkpointing import fits_not_counted

if TYPE_CHECKING:
    from framework.data import DataModule
    from framework.module import TrainModule
    from framework.trainer import Trainer


class Trials:
    """``with Trials(trainer, module, datamodule) as trials: trials.call("fit", [callback], max_steps=3)``."""

    def __init__(self, trainer: Trainer, module: TrainModule, datamodule: DataModule | None) -> None:
        self.trainer, self.module, self.datamodule = trainer, module, datamodule
        self._weights: dict[str, Any] | None = None
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> Trials:
        trainer, datamodule = self.trainer, self.datamodule
        self._kept = trainer.keep_parts()
        self._rng = get_rng_state()
        self._precision = copy.deepcopy(trainer.precision_plugin.state_dict())
        self._datamodule = copy.deepcopy(datamodule.state_dict()) if datamodule is not None else None
        self._root = tempfile.mkdtemp(prefix="fw_tuner_")
        self._stack.callback(shutil.rmtree, self._root, True)
        try:
            self._stack.enter_context(fits_not_counted())
            self._stack.enter_context(_without_module_callbacks(self.module))
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        trainer = self.trainer
        try:  # what cannot fail first, then what calls into the module, the scaler, the DataModule
            trainer.restore_parts(self._kept)
            set_rng_state(self._rng)
            if self._weights is not None:
                self.module.load_state_dict(self._weights)
            trainer.precision_plugin.load_state_dict(self._precision)
            if self.datamodule is not None and self._datamodule:
                self.datamodule.load_state_dict(self._datamodule)
        finally:
            self._stack.close()

    def keep_weights(self) -> None:
        """Remember the module's weights, once: the tuner's callbacks call this when the first
        call has set the module up. A copy on the CPU, so that it takes no accelerator memory
        from the trials (a batch-size search would find less room than there is)."""
        if self._weights is None:
            self._weights = {key: value.detach().to("cpu", copy=True) if isinstance(value, torch.Tensor)
                             else copy.deepcopy(value) for key, value in self.module.state_dict().items()}

    def call(self, fn: str, callbacks: list[Callback], train: Any = None, val: Any = None,
             limits: dict[str, int | float | None] | None = None, **settings: Any) -> None:
        """One ``trainer.<fn>`` with ``callbacks`` (and one that keeps the weights), the
        Trainer's settings with ``settings`` and ``limits`` on top; ``train``/``val``: a fit's
        loaders as the user gave them."""
        trainer, base = self.trainer, self._kept.settings
        settings_now = dataclasses.replace(
            base, default_root_dir=self._root, num_sanity_val_steps=0, max_time=None, on_nonfinite="warn",
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
            limits=dataclasses.replace(base.limits, **(limits or {})), **settings)
        trainer.lend_parts(settings_now, callbacks=[_KeepWeights(self), *callbacks],
                           loggers=[_SilentLogger(self._root)] if self._kept.loggers else [])
        module, datamodule = self.module, self.datamodule
        with _quiet():
            if fn == "fit":
                trainer.fit(module, train, val, datamodule=datamodule)
            elif fn == "predict":
                trainer.predict(module, datamodule=datamodule, return_predictions=False)
            else:
                getattr(trainer, fn)(module, verbose=False, datamodule=datamodule)


class _KeepWeights(Callback):
    """Has the ``Trials`` remember the weights at the start of its first call."""

    def __init__(self, trials: Trials) -> None:
        self._trials = trials

    def _keep(self, trainer: Trainer, module: TrainModule) -> None:
        self._trials.keep_weights()

    on_fit_start = on_validation_start = on_test_start = on_predict_start = _keep


class _SilentLogger(Logger):
    """Lightning's ``DummyLogger``, in place of the Trainer's loggers while the tuner runs: a
    module that logs through ``self.logger`` (``self.logger.experiment.add_image(...)``) runs as
    it does in Lightning's finder, and nothing reaches the real loggers."""

    def __init__(self, root: str) -> None:
        super().__init__(root, name="", version="")

    @property
    def experiment(self) -> NoExperiment:
        return NoExperiment()

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        pass

    def log_hyperparams(self, params: Any) -> None:
        pass


@contextlib.contextmanager
def _without_module_callbacks(module: TrainModule) -> Iterator[None]:
    """The module's ``configure_callbacks()`` gives none while the tuner runs (set on the
    instance, removed after): Lightning's finder replaces those too, and one of them (a
    ``LearningRateMonitor`` without a logger, an ``EarlyStopping``) would stop the trials."""
    own = module.__dict__.get("configure_callbacks")
    module.__dict__["configure_callbacks"] = _no_callbacks
    try:
        yield
    finally:
        if own is None:
            del module.__dict__["configure_callbacks"]
        else:
            module.__dict__["configure_callbacks"] = own


def _no_callbacks() -> list[Callback]:
    return []


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    log = library_logger()
    level = log.level
    log.setLevel(max(level, logging.WARNING))
    try:
        yield
    finally:
        log.setLevel(level)
