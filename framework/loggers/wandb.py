"""Weights & Biases logger: the config, metrics by step, checkpoints as model artifacts.

Install with ``pip install 'fw[wandb]'``; ``wandb`` is imported at the first use, not with fw.
Arguments mean what they mean in Lightning's ``WandbLogger``; other keyword arguments go to
``wandb.init`` (``entity``, ``group``, ``tags``, ``mode``, ...).

Offline by default without a login: with ``offline=False``, no ``mode`` argument, no
``WANDB_MODE``, and neither ``WANDB_API_KEY`` nor a ``~/.netrc`` entry for the W&B host
(``wandb login`` writes one), the run is kept offline under ``<save_dir>/wandb/`` and one logging
line says so; ``wandb sync`` uploads it later. (Lightning would ask for a login instead.)

Metrics are logged with ``trainer/global_step`` beside them, the x-axis of every chart (as in
Lightning). Hyperparameters go to ``run.config``, nested mappings kept as they are (as Lightning
does; W&B shows ``a.b``). ``name`` is the project, ``version`` the run id; ``log_dir`` is
``<save_dir>/<project>/<run id>``, where Lightning's ``ModelCheckpoint`` puts ``checkpoints/``.

Only global rank 0 writes; elsewhere ``experiment`` is a stand-in whose calls do nothing.
``finalize`` ends the run this logger started (exit code 0 after success, 1 otherwise), after
uploading what ``log_model=True`` kept for the end (only after success, as in Lightning). A
later write (``trainer.test`` after ``fit``) resumes the same run id. A run the user started
(``experiment=``, or a ``wandb.run`` in progress) is used, never ended. Online: wandb_server.py.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import Any, Literal

import torch

import framework.loggers.checkpoint_uploads as uploads
import framework.loggers.wandb_server as server
from framework.errors import ConfigError, install_command, require_package
from framework.loggers.base import Logger, NoExperiment, to_float, to_plain
from framework.rank_zero import global_rank, rank_zero_info, rank_zero_only, rank_zero_warn

STEP_KEY = "trainer/global_step"


class WandbLogger(Logger):
    """Log to `Weights & Biases <https://wandb.ai>`_.

    Args:
        name: Display name of the run.
        save_dir: The folder wandb writes under (``<save_dir>/wandb/``); ``None`` lets the
            Trainer use its ``default_root_dir``.
        version: The run id, to resume a run (same as ``id``).
        offline: Keep the run on this machine (``wandb sync`` uploads it later).
        dir: Same as ``save_dir``.
        id: Same as ``version``.
        anonymous: ``True`` allows anonymous logging (no offline default then).
        project: The project; default ``$WANDB_PROJECT``, else ``"lightning_logs"``.
        log_model: Upload ``ModelCheckpoint``'s checkpoints as model artifacts: ``"all"``
            after every save, ``True`` at the end of a successful run (every save under
            ``save_top_k=-1``), ``False`` never.
        experiment: A ``wandb`` run to log into instead of starting one.
        prefix: Put in front of every metric name, joined with ``"-"``.
        checkpoint_name: Name of the model artifact; default ``model-<run id>``.
        add_file_policy: ``"mutable"`` (wandb copies the file first) or ``"immutable"``.
        flush_timeout: fw's: how long the end of an online run waits for the server (wandb: no limit).
        **kwargs: Passed to ``wandb.init``.

    Raises:
        ModuleNotFoundError: wandb is not installed (the message says how to install it).
        ConfigError: ``offline=True`` with ``log_model`` (Lightning refuses it too);
            ``save_dir``/``dir`` or ``version``/``id`` that disagree; a bad ``log_model``; (at
            set-up, on rank 0) a keyword argument that ``wandb.init`` does not take; an online
            run whose W&B server does not answer.
    """

    def __init__(self, name: str | None = None, save_dir: str | os.PathLike | None = ".", version: str | None = None,
                 offline: bool = False, dir: str | os.PathLike | None = None, id: str | None = None,
                 anonymous: bool | None = None, project: str | None = None, log_model: bool | Literal["all"] = False,
                 experiment: Any = None, prefix: str = "", checkpoint_name: str | None = None,
                 add_file_policy: Literal["mutable", "immutable"] = "mutable", flush_timeout: float = 30.0,
                 **kwargs: Any) -> None:
        require_package("wandb", "WandbLogger", f"{install_command('wandb')} (or pip install wandb)")
        if offline and log_model:
            raise ConfigError(f"WandbLogger(offline=True, log_model={log_model!r}): Lightning refuses this pair "
                              "(checkpoints are uploaded to W&B); set offline=False, or log_model=False")
        folder = _one_of("save_dir", save_dir, "dir", dir, default=".")
        super().__init__(save_dir=folder, name=None)
        self._uploads = uploads.CheckpointUploads(log_model, "WandbLogger")
        self._offline = offline
        self._anonymous = anonymous
        self._prefix = prefix
        self._checkpoint_name = checkpoint_name
        self.add_file_policy = add_file_policy
        self._project = project or os.environ.get("WANDB_PROJECT", "lightning_logs")
        self._run_name = name
        self._id = _one_of("version", version, "id", id, default=None)
        self._wandb_init: dict[str, Any] = {"name": name, "project": self._project, "resume": "allow",
                                            "anonymous": "allow" if anonymous else None, **kwargs}
        self._experiment = experiment
        self._owns_run = False  # a run given, or found in progress, is the user's to end
        self._offline_said = False
        self.flush_timeout = flush_timeout
        self._url: str | None = None  # the server of the online run started
        self._extra = sorted(kwargs)  # for wandb.init: checked against its arguments before the first write

    # -- where ----------------------------------------------------------------------------
    @property
    def experiment(self) -> Any:
        """The ``wandb`` run (on rank 0), started on first use."""
        if global_rank() != 0:
            return NoExperiment()
        if self._experiment is None:
            self._start()
        return self._experiment

    @property
    def name(self) -> str:
        """The project (W&B's own run name is ``experiment.name``)."""
        return self._project

    @property
    def version(self) -> str | None:  # type: ignore[override]  # Lightning's: the run id, None before a run
        return self._experiment.id if self._experiment is not None else self._id

    @property
    def save_dir(self) -> str | None:  # type: ignore[override]  # Lightning's: the folder given, maybe None
        return self._save_dir

    @property
    def log_dir(self) -> str:
        """``<save_dir>/<project>/<run id>``: the parent of this run's ``checkpoints/``."""
        if self.version is None:
            _ = self.experiment  # the run id comes with the run
        return os.path.join(self._save_dir or os.getcwd(), self.name, str(self.version))

    def set_default_root(self, root_dir: str | os.PathLike | None, resume_from: str | None = None) -> None:
        """``save_dir=None`` takes the Trainer's ``default_root_dir``; nothing is started here (on
        every rank). A resumed fit starts a new run unless ``version``/``id`` is given, as in Lightning."""
        if root_dir is not None and self._save_dir is None and self._experiment is None:
            self._save_dir = os.fspath(root_dir)
        if global_rank() == 0 and self._experiment is None:
            self._check_init_arguments()  # at set-up, before training: not at the first write, steps later

    def _check_init_arguments(self) -> None:
        """A keyword ``wandb.init`` does not take is one line naming it (Lightning's ends in
        ``wandb.init``'s TypeError, at the first write)."""
        import inspect

        import wandb

        known = inspect.signature(wandb.init).parameters
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in known.values()):
            return
        unknown = [key for key in self._extra if key not in known]
        if unknown:
            from framework.errors import did_you_mean

            key = unknown[0]
            raise ConfigError(f"WandbLogger({key}=...): neither WandbLogger nor wandb.init takes an argument {key!r}"
                              f"{did_you_mean(key, known)}; wandb.init takes {', '.join(known)}")

    def set_version(self, version: int | str) -> None:
        """Resume run ``version`` at the next write (the run rank 0 of a launched call started)."""
        if self._experiment is None and version is not None:
            self._id = str(version)

    def __getstate__(self) -> dict[str, Any]:
        # A spawned worker starts its own process's run, resuming this one's id.
        return {**self.__dict__, "_experiment": None, "_id": self.version, "_owns_run": False}

    # -- what -----------------------------------------------------------------------------
    @rank_zero_only
    def log_hyperparams(self, params: Mapping[str, Any] | argparse.Namespace) -> None:
        """Update ``run.config`` (nested mappings kept; a class or function logged by its name)."""
        self.experiment.config.update(to_plain(_named(params)), allow_val_change=True)

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, Any], step: int | None) -> None:
        """Log ``metrics`` with ``trainer/global_step = step``; numbers and one-element tensors
        as floats, wandb objects (``wandb.Image``, tables) as they are."""
        row = {self._prefixed(k): (to_float(v) if isinstance(v, (int, float, torch.Tensor)) else v)
               for k, v in metrics.items()}
        if step is not None and not self._wandb_init.get("sync_tensorboard"):
            row[STEP_KEY] = int(step)
        self.experiment.log(row)

    def watch(self, model: torch.nn.Module, log: str | None = "gradients", log_freq: int = 100,
              log_graph: bool = True) -> None:
        """Log ``model``'s gradients (and parameters with ``log="all"``) every ``log_freq`` steps."""
        self.experiment.watch(model, log=log, log_freq=log_freq, log_graph=log_graph)

    @rank_zero_only
    def finalize(self, status: str) -> None:
        if status not in ("success", "finished", "failed", "interrupted"):
            raise ValueError(f"WandbLogger.finalize({status!r}): the status is success, finished, failed or interrupted")
        if self._experiment is None:
            return  # nothing was logged: no run to end
        if status == "success":
            self._uploads.at_end(self._upload)
        if self._owns_run:
            self._id = self._experiment.id
            server.finish(self._experiment, 0 if status in ("success", "finished") else 1, self._url, self.flush_timeout)
            self._experiment = None

    @rank_zero_only
    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        self._uploads.after_save(checkpoint_callback, self._upload)

    def _upload(self, callback: Any) -> None:
        import wandb

        run = self.experiment
        policy: dict[str, Any] = {} if self.add_file_policy == "mutable" else {"policy": self.add_file_policy}
        for path, score in self._uploads.new_files(callback):
            artifact = wandb.Artifact(name=self._checkpoint_name or f"model-{run.id}", type="model",
                                      metadata=uploads.metadata(path, score, callback, type(callback).__name__))
            artifact.add_file(path, name="model.ckpt", **policy)
            run.log_artifact(artifact, aliases=uploads.aliases(path, callback))

    # -- the run --------------------------------------------------------------------------
    def _start(self) -> None:
        import wandb

        if wandb.run is not None:
            rank_zero_warn("WandbLogger: a wandb run is in progress already; logging into it "
                           "(call wandb.finish() before the Trainer starts for a run of the logger's own)")
            self._experiment, self._owns_run = wandb.run, False
            return
        self._check_init_arguments()
        folder = self._save_dir if self._save_dir is not None else os.getcwd()
        os.makedirs(folder, exist_ok=True)
        settings = {**self._wandb_init, "dir": folder, "id": self._id}
        mode = self._default_mode(folder)
        if mode is not None:
            settings["mode"] = mode
        self._url = server.server_url(settings)
        if self._url is not None:
            server.check_server(self._url)  # before any step: wandb.init's own failure takes about 2 minutes
            settings["settings"] = server.with_finish_timeout(settings.get("settings"), self.flush_timeout)
        run = wandb.init(**settings)
        if getattr(run, "define_metric", None) is not None:
            if settings.get("sync_tensorboard"):
                run.define_metric("*", step_metric="global_step")
            else:
                run.define_metric(STEP_KEY)
                run.define_metric("*", step_metric=STEP_KEY, step_sync=True)
        self._experiment, self._owns_run, self._id = run, True, run.id

    def _default_mode(self, folder: str) -> str | None:
        """``"offline"`` when asked, or when nothing says otherwise and there is no login."""
        if self._offline:
            return "offline"
        if "mode" in self._wandb_init or os.environ.get("WANDB_MODE") or self._anonymous or _logged_in():
            return None
        if not self._offline_said:  # once: a later call's run (the same id, resumed) is offline too
            self._offline_said = True
            rank_zero_info(f"WandbLogger: no W&B login (no WANDB_API_KEY, no ~/.netrc entry for {server.netrc_host()}): the run "
                           f"is kept offline in {os.path.join(folder, 'wandb')}; `wandb login`, then `wandb sync` "
                           "uploads it")
        return "offline"


def _one_of(name: str, value: Any, alias: str, alias_value: Any, default: Any) -> Any:
    """Lightning's pairs of names for one argument (``save_dir``/``dir``, ``version``/``id``)."""
    value = os.fspath(value) if isinstance(value, os.PathLike) else value
    alias_value = os.fspath(alias_value) if isinstance(alias_value, os.PathLike) else alias_value
    if alias_value is None or value == alias_value:
        return value
    if value in (None, default):
        return alias_value
    raise ConfigError(f"WandbLogger({name}={value!r}, {alias}={alias_value!r}): the two name one thing; give one")


def _named(params: Any) -> Any:
    """A class or function by its name, as Lightning logs it (without calling it)."""
    if isinstance(params, argparse.Namespace):
        params = vars(params)
    if isinstance(params, Mapping):
        return {k: _named(v) for k, v in params.items()}
    if isinstance(params, (list, tuple)):
        return [_named(v) for v in params]
    if callable(params) and not isinstance(params, torch.nn.Module) and hasattr(params, "__name__"):
        return params.__name__
    return params


def _logged_in() -> bool:
    """A W&B credential in the environment or in the netrc file (what ``wandb login`` writes)."""
    import netrc

    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    path = os.environ.get("NETRC") or os.path.expanduser("~/.netrc")
    try:
        return netrc.netrc(path).authenticators(server.netrc_host()) is not None
    except (OSError, netrc.NetrcParseError):
        return False
