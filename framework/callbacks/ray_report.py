"""``RayTrainReport``: a fit inside Ray Train reports its metrics and checkpoints to Ray, and a
worker group that Ray restarts resumes from the last checkpoint reported.

A ``Trainer`` built in a worker of Ray Train's ``TorchTrainer`` (``RayTrainEnvironment``) gets
this callback unless it was given one. At each report point, as Ray's Lightning callback
(``ray.train.lightning.RayTrainReportCallback``) reports at the end of each training epoch, every
rank calls ``trainer.save_checkpoint`` into a folder of its own under the temporary directory
(rank 0 writes the one file, ``checkpoint.ckpt``; under a sharded strategy each rank would write
its shards: not yet tested under Ray) and then ``ray.train.report(metrics, checkpoint=...)`` with that folder where it holds
something, else no checkpoint: Ray uploads the folders into one checkpoint under the run's
``storage_path`` (a local folder or object storage) and the local copies go.

A report is made only on a batch that completed an optimizer step (never partway through
gradient accumulation, whose checkpoint would not resume exactly: a fit stopped there reports
nothing where it stopped), and never at the step a fit started from (step 0, or the step of the
checkpoint it resumed): ``ModelCheckpoint``'s rule.

When Ray restarts the worker group (``FailureConfig(max_failures=...)``, an elastic resize) or
a run of the same name, the fit of each new worker that reported Ray's latest checkpoint resumes
from it (``checkpoint_to_resume``), exactly: fw's mid-epoch resume, and its resume on another
number of ranks, which an elastic group that comes back smaller needs. Each checkpoint records
which fit of the worker's program reported it (``trainer.state.fit_index``: 1, 2, ... in the
order the program runs them): a program that fits twice resumes its second fit from the second
fit's checkpoint, and runs its first fit again from the start (a later fit's checkpoint is never
loaded into an earlier fit, nor the reverse).

``ray`` is imported only here, and only when a report or a resume happens.
"""

from __future__ import annotations

import inspect
import os
import shutil
import tempfile
from typing import TYPE_CHECKING, Any

from framework.callbacks.base import Callback
from framework.callbacks.checkpoint_schedule import saves_on_train_epoch_end
from framework.environments.ray import RayTrainEnvironment
from framework.errors import CheckpointError, ConfigError, install_command
from framework.rank_zero import rank_zero_info

if TYPE_CHECKING:
    from framework.module import TrainModule
    from framework.trainer import Trainer

#: the file of fw's checkpoint inside each checkpoint folder reported to Ray
CHECKPOINT_FILE = "checkpoint.ckpt"
#: the key of Ray's checkpoint metadata that holds which fit of the worker's program reported it
FIT_INDEX_KEY = "fw_fit_index"

#: Ray's checkpoint as this worker process found it at its first fit ([] before that): Ray's
#: ``get_checkpoint()`` moves on to each checkpoint the process reports, and a later fit of the
#: program must see the one Ray restarted the workers with
_found_at_start: list[Any] = []
#: folders that ``checkpoint_to_resume`` downloaded, removed once the resume has loaded them
_downloaded: list[str] = []


def import_ray_train() -> Any:
    """``ray.train``, or one line that says how to install it.

    Raises:
        ConfigError: ray (with its ``train`` extra) is not installed.
    """
    try:
        import ray.train
    except ImportError as err:
        raise ConfigError(f"fw's Ray Train support needs ray[train] ({err}): {install_command('ray')}") from None
    return ray.train


class RayTrainReport(Callback):
    """Report metrics and a checkpoint to Ray Train at epoch ends and/or every N optimizer steps.

    Every rank must reach each report (``ray.train.report`` is a barrier): the points below are
    the same on every rank. A fit that ends between two of them (``max_steps``, ``max_time``, an
    early stop) also reports where it ended, so that Ray's ``result.checkpoint`` is its last state.

    Args:
        every_n_epochs: report at the end of every this many training epochs (after the epoch's
            validation, when it runs there; 0: never). Default 1, unless ``every_n_train_steps``
            is given.
        every_n_train_steps: also report every this many optimizer steps (mid-epoch checkpoints,
            from which a restarted group resumes exactly). ``None`` or 0: never.
        checkpoint: attach a checkpoint to each report (``False``: metrics only; a restart
            then starts from scratch).

    Raises:
        ConfigError: an interval that is not an int >= 0.
    """

    def __init__(self, every_n_epochs: int | None = None, every_n_train_steps: int | None = None,
                 checkpoint: bool = True) -> None:
        for name, value in (("every_n_epochs", every_n_epochs), ("every_n_train_steps", every_n_train_steps)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ConfigError(f"RayTrainReport({name}={value!r}) must be an int >= 0")
        self.every_n_epochs = (1 if not every_n_train_steps else 0) if every_n_epochs is None else every_n_epochs
        self.every_n_train_steps = every_n_train_steps or 0
        self.checkpoint = bool(checkpoint)
        # the global step of the last report, or of the fit's start: a report only on a batch that
        # moved the step on (completed an optimizer step), one per step
        self._reported_step = self._seen_step = 0
        self._mid_window = False

    # -- when ---------------------------------------------------------------------------------
    def setup(self, trainer: Trainer, module: TrainModule, stage: str) -> None:
        if stage != "fit":
            return
        if not isinstance(trainer.environment, RayTrainEnvironment):
            raise ConfigError("RayTrainReport reports to Ray Train, and this process is no Ray Train worker (it runs "
                              f"under {trainer.environment.name}): build the Trainer inside the train_loop_per_worker "
                              "of a ray.train.torch.TorchTrainer, or drop the callback")
        import_ray_train()

    def on_train_start(self, trainer: Trainer, module: TrainModule) -> None:
        # step 0, or the step of the checkpoint resumed: reported already, or an untrained model;
        # until the step moves on, a batch is partway through an accumulation window
        self._reported_step = self._seen_step = trainer.global_step
        self._mid_window = False  # the last training batch left an accumulation window open

    def teardown(self, trainer: Trainer, module: TrainModule, stage: str) -> None:
        drop_downloaded_copies()  # a fit that failed before its resume loaded the copy

    def on_train_batch_end(self, trainer: Trainer, module: TrainModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        # a batch that did not move the step on is partway through an accumulation window: its
        # state (gradients accumulated, not applied) resumes inexactly, so nothing reports it
        self._mid_window, self._seen_step = trainer.global_step == self._seen_step, trainer.global_step
        n = self.every_n_train_steps
        if n and trainer.global_step % n == 0 and not trainer.sanity_checking:
            self._report(trainer)

    def on_train_epoch_end(self, trainer: Trainer, module: TrainModule) -> None:
        if saves_on_train_epoch_end(None, trainer):
            self._report_epoch(trainer)

    def on_validation_end(self, trainer: Trainer, module: TrainModule) -> None:
        # where validation does not run once at each epoch's end, its ends are the epoch points
        # (ModelCheckpoint's rule): the checkpoint holds the weights it scored, with its metrics
        if not trainer.sanity_checking and trainer.state.fn == "fit" and not saves_on_train_epoch_end(None, trainer):
            self._report_epoch(trainer)

    def on_train_end(self, trainer: Trainer, module: TrainModule) -> None:
        # a fit that ends between report points (max_steps, max_time, a stop) reports where it ended:
        # Ray's result.checkpoint is then the fit's last state
        if self.every_n_epochs or self.every_n_train_steps:
            self._report(trainer)

    def _report_epoch(self, trainer: Trainer) -> None:
        n = self.every_n_epochs
        if n and (trainer.current_epoch + 1) % n == 0:
            self._report(trainer)

    # -- what ---------------------------------------------------------------------------------
    def _report(self, trainer: Trainer) -> None:
        """Save on every rank into a folder of its own, report it (rank 0's holds the file), and
        drop the local copies once Ray has uploaded them."""
        if trainer.global_step == self._reported_step or trainer.fast_dev_run:
            return
        if self._mid_window:  # a stop (max_time, should_stop) partway through an accumulation window
            rank_zero_info(f"fw: the last training batch did not complete an optimizer step (partway through a "
                           f"gradient accumulation window after step {trainer.global_step}): nothing reported to Ray "
                           f"there, as such a checkpoint would not resume exactly (Ray's last report is of step "
                           f"{self._reported_step})")
            return
        self._reported_step = trainer.global_step
        train = import_ray_train()
        metrics = _scalars(trainer.callback_metrics)
        metrics.update(epoch=trainer.current_epoch, step=trainer.global_step)
        if not self.checkpoint:
            train.report(metrics)
            return
        folder = tempfile.mkdtemp(prefix=f"fw-ray-step{trainer.global_step}-rank{trainer.global_rank}-")
        try:
            trainer.save_checkpoint(os.path.join(folder, CHECKPOINT_FILE))
            written = train.Checkpoint.from_directory(folder) if os.listdir(folder) else None
            if written is not None:
                written.set_metadata({FIT_INDEX_KEY: trainer.state.fit_index})
            train.report(metrics, checkpoint=written, **_keep_no_local_copy(train))
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def _keep_no_local_copy(train: Any) -> dict[str, Any]:
    """Ray Train v2's ``report`` can delete a folder once uploaded (with an asynchronous upload the
    folder outlives the call); v1's has no such argument. Asked of ``report``'s own signature, not of
    Ray's private modules."""
    try:
        parameters = inspect.signature(train.report).parameters
    except (TypeError, ValueError):  # no signature to read: the plain call works with every Ray
        return {}
    return {"delete_local_checkpoint_after_upload": True} if "delete_local_checkpoint_after_upload" in parameters else {}


def _scalars(metrics: dict[str, Any]) -> dict[str, float]:
    """The logged values that are one number (Ray's result table takes numbers)."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        try:
            out[key] = float(value.item() if hasattr(value, "item") else value)
        except (TypeError, ValueError, RuntimeError):  # a tensor of several values, a string
            continue
    return out


def checkpoint_to_resume(rank: int, fit_index: int) -> str | None:
    """The fw checkpoint inside Ray Train's latest checkpoint of this run (``ray.train.get_checkpoint()``
    as this worker process found it at its first fit), when fit ``fit_index`` of the program
    reported it; downloaded first where Ray keeps it elsewhere (object storage: the copy goes with
    ``drop_downloaded_copies`` once loaded). None when Ray has none (the first attempt of a new
    run), or when another fit of the program reported it.

    Raises:
        CheckpointError: Ray's checkpoint holds no fw checkpoint (not written by ``RayTrainReport``).
    """
    train = import_ray_train()
    if not _found_at_start:
        _found_at_start.append(train.get_checkpoint())
    reported = _found_at_start[0]
    if reported is None:
        return None
    made_by = (reported.get_metadata() or {}).get(FIT_INDEX_KEY, 1)  # 1: reported before fw recorded it
    if made_by != fit_index:
        rank_zero_info(f"fw: Ray Train's last reported checkpoint {reported.path} comes from fit {made_by} of this "
                       f"program, not from this one (fit {fit_index}): this fit does not resume from it")
        return None
    if getattr(reported.filesystem, "type_name", "") == "local":  # pyarrow's LocalFileSystem
        folder = reported.path
    else:  # object storage: each rank reads its own copy
        folder = tempfile.mkdtemp(prefix=f"fw-ray-resume-rank{rank}-")
        _downloaded.append(folder)
        reported.to_directory(folder)
    path = os.path.join(folder, CHECKPOINT_FILE)
    if not os.path.exists(path):
        drop_downloaded_copies()
        raise CheckpointError(f"Ray Train's checkpoint {reported.path!r} holds no {CHECKPOINT_FILE}: it was not "
                              "reported by fw's RayTrainReport; start a new run (another RunConfig(name=...)) or "
                              "pass ckpt_path to fit")
    rank_zero_info(f"fw: Ray Train restarted this run's workers: resuming from its last reported checkpoint "
                   f"{reported.path}")
    return path


def drop_downloaded_copies() -> None:
    """Remove the copies of Ray's checkpoint that ``checkpoint_to_resume`` downloaded (the resume has
    loaded them, or the fit ended before it did)."""
    while _downloaded:
        shutil.rmtree(_downloaded.pop(), ignore_errors=True)
