"""MLflow logger: parameters, metrics by step, the run's status, and checkpoints as artifacts.

Install with ``pip install 'fw[mlflow]'``; ``mlflow`` is imported at the first use, not with fw.
Arguments mean what they mean in Lightning's ``MLFlowLogger``. Where the run goes:

* ``tracking_uri`` given (``http://host:5000`` for a server, ``sqlite:///path/mlflow.db``,
  ``file:/path``): there. Else ``$MLFLOW_TRACKING_URI`` when set.
* Else a local store under ``save_dir`` (default ``./mlruns``), no server needed: the file
  store ``file:<save_dir>``, as in Lightning, where the installed mlflow still accepts it
  (mlflow 2; mlflow 3 with ``MLFLOW_ALLOW_FILE_STORE=true``). Recent mlflow 3 refuses the file
  store by default, so there the store is ``sqlite:///<save_dir>/mlflow.db`` with the artifacts in
  ``<save_dir>/artifacts``, and one logging line says so.

``name`` is the experiment id and ``version`` the run id, as in Lightning (asking creates them).
``log_dir`` is ``<save_dir>/<experiment id>/<run id>`` (``<default_root_dir>/...`` for a remote
store): where Lightning's ``ModelCheckpoint`` puts this run's ``checkpoints/`` folder.

A server that is not there when the run is created is refused in one line (the URL and how to
fix it), as is a URI whose scheme MLflow does not know. Once the run exists, a server's calls
(metrics, parameters, checkpoint uploads, the run's status) are sent from a background thread
(``sender.py``), so that a server that goes away mid-fit never stops training: one warning names
the logger, the URL and what waits; what was logged meanwhile is kept (up to 10,000 calls, a
checkpoint as a hard link to its file) and sent, in order, when the server is back; at the end the
fit waits ``flush_timeout`` seconds for it, then one warning counts what was not sent. (Lightning's
``MLFlowLogger`` blocks in MLflow's retries, about 4 minutes a call, then ends the fit with
MLflow's error.) A local store is written directly.

Only global rank 0 writes; elsewhere ``experiment`` is a stand-in whose calls do nothing.
``finalize`` ends the run: ``FINISHED`` after success, ``FAILED`` after an error, ``KILLED``
when interrupted. A later write (``trainer.test`` after ``fit``) goes to the same run, which is
marked ``RUNNING`` again until its next ``finalize``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import time
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import framework.loggers.checkpoint_uploads as uploads
import framework.loggers.mlflow_store as store
from framework.errors import ConfigError, install_command, require_package
from framework.loggers.base import Logger, NoExperiment, flatten, to_float, to_plain
from framework.loggers.sender import Call, Sender
from framework.rank_zero import global_rank, rank_zero_only, rank_zero_warn

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

#: fw's ``finalize`` status -> MLflow's run status
RUN_STATUS = {"success": "FINISHED", "finished": "FINISHED", "failed": "FAILED", "interrupted": "KILLED"}


class MLFlowLogger(Logger):
    """Log to `MLflow <https://mlflow.org>`_.

    Args:
        experiment_name: The experiment the run belongs to; created if there is none of that name.
        run_name: The run's name (the ``mlflow.runName`` tag, which it overrides in ``tags``).
        tracking_uri: Where the runs are kept; see the module docstring for the default.
        tags: Tags of the new run.
        save_dir: The folder of the local store when no ``tracking_uri`` is given. ``None``
            lets the Trainer use its ``default_root_dir``.
        log_model: Upload ``ModelCheckpoint``'s checkpoints as artifacts: ``"all"`` after every
            save, ``True`` at the end of the run (every save under ``save_top_k=-1``), ``False`` never.
        prefix: Put in front of every metric name, joined with ``"-"``.
        artifact_location: Where a newly created experiment keeps its artifacts.
        run_id: Log into this existing run instead of starting a new one.
        synchronous: Passed to MLflow's ``log_batch`` (``False``: do not wait for each write).
        flush_timeout: fw's: at the end of a run, how long to wait for a server that does not
            answer to take what is still to be sent (seconds); as long as it takes what is sent,
            the wait goes on.

    Raises:
        ModuleNotFoundError: mlflow is not installed (the message says how to install it).
        ConfigError: ``log_model`` is not true, false or ``"all"``; ``run_id`` names no run;
            (at the first write) no server answers at ``tracking_uri``, or MLflow knows no store
            of its scheme.
    """

    def __init__(self, experiment_name: str = "lightning_logs", run_name: str | None = None,
                 tracking_uri: str | None = None, tags: dict[str, Any] | None = None,
                 save_dir: str | os.PathLike | None = "./mlruns", log_model: bool | Literal["all"] = False,
                 prefix: str = "", artifact_location: str | None = None, run_id: str | None = None,
                 synchronous: bool | None = None, flush_timeout: float = 30.0) -> None:
        require_package("mlflow", "MLFlowLogger", f"{install_command('mlflow')} (or pip install mlflow)")
        super().__init__(save_dir=save_dir, name=None)
        self._uploads = uploads.CheckpointUploads(log_model, "MLFlowLogger")
        self._experiment_name = experiment_name
        self._run_name = run_name
        self._given_uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or None
        self._tracking_uri: str | None = None  # resolved at the first use (the local store needs mlflow)
        self.tags = dict(tags or {})
        self._prefix = prefix
        self._artifact_location = artifact_location
        self._run_id = run_id
        self._experiment_id: str | None = None
        self._batch_options: dict[str, Any] = {} if synchronous is None else {"synchronous": synchronous}
        self._default_root: str | None = None
        self._client: MlflowClient | None = None
        self._running = False
        self.flush_timeout = flush_timeout
        self._sender: Sender | None = None

    # -- where ----------------------------------------------------------------------------
    @property
    def experiment(self) -> MlflowClient:
        """The ``MlflowClient`` (on rank 0), with this logger's experiment and run created."""
        if global_rank() != 0:
            return NoExperiment()  # type: ignore[return-value]
        if self._client is None:
            self._start()
        assert self._client is not None
        return self._client

    @property
    def tracking_uri(self) -> str:
        if self._tracking_uri is None:
            self._tracking_uri = self._given_uri or store.local_store(self._local_root())
        return self._tracking_uri

    @property
    def run_id(self) -> str | None:
        _ = self.experiment
        return self._run_id

    @property
    def experiment_id(self) -> str | None:
        _ = self.experiment
        return self._experiment_id

    @property
    def name(self) -> str | None:  # type: ignore[override]  # Lightning's: the experiment id
        return self.experiment_id

    @property
    def version(self) -> str | None:  # type: ignore[override]  # Lightning's: the run id
        return self.run_id

    @property
    def save_dir(self) -> str | None:  # type: ignore[override]  # None for a store that is not a local folder
        """The local folder of the store (``None`` for a server or a database given by URI)."""
        return self._local_root() if self._given_uri is None else store.file_uri_path(self._given_uri)

    @property
    def root_dir(self) -> str:
        return os.path.join(self.save_dir or self._default_root or os.getcwd(), str(self.name))

    @property
    def log_dir(self) -> str:
        """``<save_dir>/<experiment id>/<run id>``: the parent of this run's ``checkpoints/``."""
        return os.path.join(self.root_dir, str(self.version))

    def set_default_root(self, root_dir: str | os.PathLike | None, resume_from: str | None = None) -> None:
        """``save_dir=None`` takes the Trainer's ``default_root_dir``; nothing is created here (on
        every rank), and a resumed fit starts a new run unless ``run_id`` is given, as in Lightning."""
        if root_dir is None:
            return
        self._default_root = os.fspath(root_dir)
        if self._save_dir is None and self._client is None:
            self._save_dir = self._default_root

    def set_version(self, version: int | str) -> None:
        """Log into run ``version`` from now on (the run rank 0 of a launched call created)."""
        if version is not None and str(version) != self._run_id:
            self._run_id, self._client, self._experiment_id = str(version), None, None

    def _local_root(self) -> str:
        return self._save_dir if self._save_dir is not None else os.getcwd()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_client": None, "_sender": None}  # a spawned worker makes its own, same run

    # -- what -----------------------------------------------------------------------------
    @rank_zero_only
    def log_hyperparams(self, params: Mapping[str, Any] | argparse.Namespace) -> None:
        """Record hyperparameters as MLflow params, nested keys flattened to ``"a/b"``."""
        from mlflow.entities import Param
        from mlflow.utils import validation

        limit = int(getattr(validation, "MAX_PARAM_VAL_LENGTH", 250))
        batch = []
        for key, value in flatten(to_plain(params)).items():
            text = str(value)
            if len(text) > limit:
                rank_zero_warn(f"MLFlowLogger: the value of hyperparameter {key!r} is {len(text)} characters long; "
                               f"MLflow keeps the first {limit}")
                text = text[:limit]
            batch.append(Param(key, text))
        client, run_id = self._writing()
        for start in range(0, len(batch), 100):  # MLflow takes at most 100 params per call
            part = batch[start:start + 100]
            self._send(partial(client.log_batch, run_id, params=part, **self._batch_options), "parameters", len(part))

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        batch = [Metric(key=self._metric_key(key), value=to_float(value), timestamp=stamp, step=int(step or 0))
                 for key, value in metrics.items()]
        client, run_id = self._writing()
        for start in range(0, len(batch), 1000):  # MLflow takes at most 1000 metrics per call
            part = batch[start:start + 1000]
            self._send(partial(client.log_batch, run_id, metrics=part, **self._batch_options), "metric values",
                       len(part))

    @rank_zero_only
    def finalize(self, status: str) -> None:
        """Upload what ``log_model=True`` kept for the end (whatever the status, as Lightning
        does), then end the run with MLflow's status for ``status``."""
        if status not in RUN_STATUS:
            raise ValueError(f"MLFlowLogger.finalize({status!r}): the status is one of {', '.join(RUN_STATUS)}")
        if self._client is None:
            return  # nothing was logged: no run to end
        self._uploads.at_end(self._upload)
        client, run_id = self._client, self._run_id
        assert run_id is not None, "a client is made with its run"
        self._send(lambda: client.set_terminated(run_id, RUN_STATUS[status]), f"the run's end ({RUN_STATUS[status]})", 1)
        self._running = False
        if self._sender is not None and self._sender.mine:  # what is left goes now, or is counted as not sent
            self._sender.close(self.flush_timeout)
        self._sender = None

    @rank_zero_only
    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        self._uploads.after_save(checkpoint_callback, self._upload)

    def _metric_key(self, key: str) -> str:
        key = self._prefixed(key)
        allowed = re.sub(r"[^a-zA-Z0-9_/. -]+", "", key)
        if allowed != key:
            rank_zero_warn(f"MLFlowLogger: MLflow allows only letters, digits and '_', '/', '.', ' ', '-' in a "
                           f"metric name; {key!r} is logged as {allowed!r}")
        return allowed

    def _upload(self, callback: Any) -> None:
        """Each new checkpoint of ``callback`` as Lightning lays it out (``<stem>/<file>``,
        ``<stem>/metadata.yaml``, ``<stem>/aliases.txt``), staged as it is now (``uploads.stage``)."""
        client, run_id = self._writing()
        for path, score in self._uploads.new_files(callback):
            staged = uploads.stage(path, metadata=uploads.metadata(path, score, callback, "Checkpoint"),
                                   aliases=uploads.aliases(path, callback))
            self._send(partial(client.log_artifacts, run_id, staged, Path(path).stem), "checkpoints", 1,
                       done=partial(shutil.rmtree, staged, ignore_errors=True))

    def _send(self, send: Callable[[], object], what: str, count: int, done: Callable[[], None] | None = None) -> None:
        """A call to the store: from the background sender for a server, here for a local store."""
        if not store.is_server(self.tracking_uri):
            store.send_now(send, done)
            return
        if self._sender is None or not self._sender.mine:  # none yet, or the copy a fork made of the parent's
            where = self.tracking_uri
            self._sender = Sender("MLFlowLogger", where, wait=self.flush_timeout,
                                  answers=lambda: store.why_not_answering(where) is None)
        self._sender.put(Call(send, what, count, done))

    # -- the run --------------------------------------------------------------------------
    def _writing(self) -> tuple[MlflowClient, str]:
        """The client and the run id, the run marked ``RUNNING`` again if a ``finalize`` ended it."""
        client = self.experiment
        run_id = self._run_id
        assert run_id is not None, "the client is made with its run"
        if not self._running:
            self._send(lambda: client.update_run(run_id, status="RUNNING"), "the run's status (RUNNING)", 1)
            self._running = True
        return client, run_id

    def _start(self) -> None:
        from mlflow.exceptions import MlflowException

        if store.is_server(self.tracking_uri):
            store.check_server(self.tracking_uri)  # a server that is not there: one line now, not minutes of retries
        client = store.make_client(self.tracking_uri)
        if self._run_id is not None:
            try:
                self._experiment_id = client.get_run(self._run_id).info.experiment_id
            except MlflowException as err:
                raise ConfigError(f"MLFlowLogger(run_id={self._run_id!r}): no such run in {self.tracking_uri} "
                                  f"({str(err).splitlines()[0]}); give an existing run id, or none for a new run") from None
            self._client, self._running = client, False
            return
        location = self._artifact_location
        if location is None and self.tracking_uri.startswith("sqlite:") and self._given_uri is None:
            location = Path(self._local_root(), "artifacts").resolve().as_uri()  # beside the local database
        self._experiment_id = store.find_or_create_experiment(client, self._experiment_name, location)
        tags = dict(self.tags)
        tags.update({} if self._run_name is None else {"mlflow.runName": self._run_name})
        from mlflow.tracking.context.registry import resolve_tags

        run = client.create_run(experiment_id=self._experiment_id, tags=resolve_tags(tags))
        self._run_id, self._client, self._running = run.info.run_id, client, True
