"""fw inside Ray Train: a Trainer built in a Ray worker's loop reports to Ray and resumes from Ray's checkpoint.

Nothing needs wiring in the worker: a ``framework.Trainer`` built inside the
``train_loop_per_worker`` of Ray Train's ``TorchTrainer`` finds Ray's workers
(``framework.environments.RayTrainEnvironment``: rank, local rank, world size, and the process
group Ray made, which it uses and leaves to Ray), reports its metrics and checkpoints with
``ray.train.report`` (``framework.callbacks.RayTrainReport``, added unless given), and, when Ray
restarts the worker group or resizes an elastic one, the fit that reported Ray's last checkpoint
(``ray.train.get_checkpoint()``) resumes exactly from it (the first fit, in a loop that fits once)::

    import framework as fw
    import framework.ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    def train_loop(config):
        trainer = fw.Trainer(max_epochs=config["epochs"])   # devices, strategy: Ray's workers
        trainer.fit(MyModel(), datamodule=MyData())         # no ckpt_path: Ray's, on a restart

    result = framework.ray.fit(TorchTrainer(
        train_loop, train_loop_config={"epochs": 3},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path="/shared/runs", name="mymodel",
                             failure_config=FailureConfig(max_failures=2))))

``fit`` here runs ``TorchTrainer.fit()`` on the driver (and puts back the SIGINT handler Ray's
fit leaves behind) and turns a worker's error into that error itself (``ConfigError``: one line, fw's message), where Ray alone raises a
``WorkerGroupError`` that wraps each rank's traceback. ``import framework`` never imports ray;
this package does, when used.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

from framework.callbacks.ray_report import CHECKPOINT_FILE, RayTrainReport, import_ray_train

__all__ = ["CHECKPOINT_FILE", "RayTrainReport", "fit", "worker_error"]


def fit(trainer: Any) -> Any:
    """Run a Ray Train ``TorchTrainer`` (``trainer.fit()``) and return its ``ray.train.Result``.

    A worker that failed with an error of its own (fw's ``ConfigError`` for a bad argument, the
    ``ValueError`` a ``training_step`` raised) ends the call with that error, as the same code
    run without Ray would: its message, one line, and a note that names the rank. Ray's
    ``WorkerGroupError`` (every rank's traceback) is in Ray's log above it.

    Raises:
        ConfigError: ray[train] is not installed.
        Exception: the first failing worker's error (see ``worker_error``); Ray's own errors
            (a controller failure, no resources) as Ray raises them.
    """
    import_ray_train()
    from ray.train import WorkerGroupError

    # Ray's fit sets a SIGINT handler (Ctrl-C stops the controller) and leaves it: put it back
    sigint = signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
    try:
        return trainer.fit()
    except WorkerGroupError as err:
        found = worker_error(err)
        if found is None:
            raise
        raise found from None  # Ray logged every rank's traceback already
    finally:
        if sigint is not None:
            signal.signal(signal.SIGINT, sigint)


def worker_error(err: BaseException) -> BaseException | None:
    """The error of the lowest failing rank in Ray's ``WorkerGroupError``, with a note that
    names the rank, or None when Ray holds none (a worker that died: ``SIGKILL``, out of memory).
    An ``FwError`` comes first: the user's mistake, where the other ranks' errors follow from it."""
    failures: dict[int, BaseException] = dict(getattr(err, "worker_failures", None) or {})
    if not failures:
        return None
    from framework.errors import FwError

    ranks = sorted(failures, key=lambda rank: (not isinstance(failures[rank], FwError), rank))
    rank = ranks[0]
    error = failures[rank]
    if not isinstance(error, Exception) or type(error).__module__.startswith("ray."):
        return None  # Ray's own (a worker actor that died), not the training code's
    same = [r for r in sorted(failures) if type(failures[r]) is type(error) and str(failures[r]) == str(error)]
    where = f"rank {rank}" if len(same) <= 1 else "ranks " + ",".join(map(str, same))
    add_note = getattr(error, "add_note", None)  # Python >= 3.11
    if add_note is not None:
        add_note(f"(raised in Ray Train worker {where}; the traceback is in Ray's log above)")
    return error
