"""The run's loggers: which ones (the ``logger`` argument), where they write (the run
directory, the same on every rank) and what they are told first (the hyperparameters)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from framework.checkpointing.file import plain_hparams
from framework.errors import ConfigError

if TYPE_CHECKING:
    from framework.data import DataModule
    from framework.module import TrainModule
    from framework.trainer.run import Run


def resolve_loggers(logger: Any) -> list:
    from framework.loggers import Logger, TensorBoardLogger

    if logger is True:
        return [TensorBoardLogger()]
    if logger in (False, None):
        return []
    loggers = list(logger) if isinstance(logger, (list, tuple)) else [logger]
    for lg in loggers:
        if not isinstance(lg, Logger):
            raise ConfigError(
                f"logger: {lg!r} is not an fw Logger; use true, false, or a mapping like "
                "{_target_: framework.loggers.TensorBoardLogger}"
            )
    return loggers


def dev_run_loggers(logger: Any) -> list:
    """A ``fast_dev_run``'s loggers, Lightning's: one ``DummyLogger`` where any were asked for."""
    from framework.loggers import DummyLogger

    return [DummyLogger()] if resolve_loggers(logger) else []


def setup_loggers(run: Run, resume_path: str | None, root_error: str | None) -> None:
    """Where the loggers write: their version folders are picked (a resumed fit's is the one
    its checkpoint came from; an evaluation's is a new one, as in Lightning, so that it never
    writes over a fit's files), nothing is created yet. ``root_error``: why rank 0 cannot write
    the run directory, as every rank agreed at set-up (``trainer/agreement.py``); every rank
    raises it."""
    root, strategy = run.settings.default_root_dir, run.strategy
    if root_error:
        raise ConfigError(root_error)
    for i, lg in enumerate(run.loggers):
        lg.set_default_root(root, resume_from=resume_path if run.fn == "fit" else None)
        lg.keep_apart_from(run.loggers[:i])
        # loggers of one Trainer writing into one folder write one hparams file (the same hyperparameters)
        lg.hparams_file = next((other.hparams_file for other in run.loggers[:i] if other.log_dir == lg.log_dir),
                               lg.hparams_file)
    log_dir = run.loggers[0].log_dir if run.loggers and strategy.is_global_zero else None
    # every rank has the same loggers (the same arguments): without any there is nothing to send
    run.log_dir = strategy.broadcast(log_dir) if strategy.is_distributed and run.loggers else log_dir
    _logged_hparams(run.module, run.datamodule)  # refuses clashing names now, before the checkpoint loads


def log_hyperparameters(run: Run) -> None:
    """The loggers' first write (which creates the version folder), as in Lightning once the
    checkpoint is loaded: a run refused at set-up (a missing checkpoint, one of another model)
    leaves no folder behind."""
    strategy = run.strategy
    hparams = _logged_hparams(run.module, run.datamodule)
    if strategy.is_global_zero and run.loggers and hparams is not None:
        for lg in run.loggers:
            lg.log_hyperparams(plain_hparams(hparams))


def _logged_hparams(module: TrainModule, datamodule: DataModule | None) -> dict | None:
    """What the loggers get, as in Lightning: the module's and the DataModule's hyperparameters
    as ``save_hyperparameters`` recorded them (``logger=False`` there leaves them out); None
    when neither saved any for the loggers (Lightning then calls no ``log_hyperparams``, so no
    ``hp_metric`` placeholder either); a name both give with different values is an error."""
    module_logs = getattr(module, "_log_hyperparams", False)
    datamodule_logs = datamodule is not None and getattr(datamodule, "_log_hyperparams", False)
    if not module_logs and not datamodule_logs:
        return None
    ours = module.hparams_initial if module_logs else {}
    theirs = datamodule.hparams_initial if datamodule is not None and datamodule_logs else {}
    clash = sorted(key for key in ours.keys() & theirs.keys() if ours[key] != theirs[key])
    if clash:
        raise ConfigError(f"hyperparameter(s) {', '.join(map(repr, clash))} differ between {type(module).__name__} "
                          f"and {type(datamodule).__name__}: rename one, or save_hyperparameters(logger=False) in one")
    return {**ours, **theirs}
