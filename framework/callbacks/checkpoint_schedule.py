"""When ``ModelCheckpoint`` saves, and what a save point sees.

Save points come every ``every_n_epochs`` epochs and every ``every_n_train_steps`` optimizer
steps (0: never; neither given: every epoch, as in Lightning). Epoch save points come at the end
of the training epoch, or, as in Lightning, at the end of each validation run when validation
does not simply run once at the end of every epoch (``val_check_interval`` other than 1.0, or
``check_val_every_n_epoch`` other than 1): the checkpoint then holds the weights that validation
scored (after the epoch's last steps, none was run). ``save_on_train_epoch_end`` decides it
instead when given.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from framework.errors import ConfigError, did_you_mean

if TYPE_CHECKING:
    from framework.trainer import Trainer


def check_arguments(monitor: str | None, mode: str, save_top_k: int, save_on_exception: bool,
                    train_time_interval: Any, save_last: Any = None) -> None:
    """Refuse what ModelCheckpoint cannot do: a ``mode``, ``save_top_k`` or ``save_last`` out of
    range, several files without a monitor to rank them, and Lightning's options fw does not have,
    unless off."""
    if save_last not in (None, True, False, "link", "latest"):
        raise ConfigError(f"ModelCheckpoint(save_last={save_last!r}) must be True, False, 'link' or 'latest' "
                          "(True: last.ckpt at every save point, 'latest' too, chosen; 'link': a link to the newest file)")
    if mode not in ("min", "max"):
        raise ConfigError(f"ModelCheckpoint(mode={mode!r}) must be 'min' or 'max'{did_you_mean(mode, ['min', 'max'])}")
    if not isinstance(save_top_k, int) or save_top_k < -1:
        raise ConfigError(f"ModelCheckpoint(save_top_k={save_top_k!r}) must be an int >= -1 (-1 keeps all)")
    if monitor is None and save_top_k not in (-1, 0, 1):
        raise ConfigError(f"ModelCheckpoint(save_top_k={save_top_k}) needs a monitor to rank checkpoints by. "
                          "HINT: set monitor='val/loss' (or save_top_k to -1, 0 or 1).")
    instead = {"train_time_interval": (train_time_interval is not None, "use every_n_train_steps"),
               "save_on_exception": (save_on_exception, "a stop signal already saves preempted.ckpt; catch the "
                                     "exception and call trainer.save_checkpoint(path) for others")}
    for name, (given, what) in instead.items():
        if given:
            raise ConfigError(f"ModelCheckpoint({name}=...) is not supported by fw: {what}")


def save_intervals(every_n_epochs: int | None, every_n_train_steps: int | None) -> tuple[int, int]:
    """``(every_n_epochs, every_n_train_steps)`` as given, 0 for never.

    Raises:
        ConfigError: a value that is not an int >= 0, or both above 0.
    """
    for arg, value in (("every_n_epochs", every_n_epochs), ("every_n_train_steps", every_n_train_steps)):
        if value is not None and (not isinstance(value, int) or value < 0):
            raise ConfigError(f"ModelCheckpoint({arg}={value!r}) must be an int >= 0")
    if every_n_epochs is None and every_n_train_steps is None:
        return 1, 0
    if every_n_epochs and every_n_train_steps:  # one of them would be ignored
        raise ConfigError(f"ModelCheckpoint(every_n_train_steps={every_n_train_steps}, every_n_epochs={every_n_epochs}): "
                          "the two are mutually exclusive, as in Lightning; give one, or use two ModelCheckpoints")
    return every_n_epochs or 0, every_n_train_steps or 0


def saves_on_train_epoch_end(setting: bool | None, trainer: Trainer) -> bool:
    """Lightning's rule (``_should_save_on_train_epoch_end``), unless ``setting`` says."""
    if setting is not None:
        return setting
    if trainer.check_val_every_n_epoch != 1:
        return False
    if trainer.val_dataloaders is None:
        return True
    return trainer.val_check_interval is None or trainer.val_check_interval == 1.0  # 1 too, as in Lightning


def monitor_candidates(trainer: Trainer) -> dict[str, float]:
    """What a save point can rank by and name its file with: every scalar of
    ``trainer.callback_metrics``, and ``epoch`` and ``step``."""
    candidates: dict[str, float] = {}
    for key, value in trainer.callback_metrics.items():
        try:
            candidates[key] = float(value.item() if hasattr(value, "item") else value)
        except (TypeError, ValueError, RuntimeError):
            continue  # not a scalar: cannot be monitored or formatted
    # a logged "epoch" or "step" names the file, as in Lightning (cast to int); else the run's
    candidates["epoch"] = int(candidates["epoch"]) if "epoch" in candidates else trainer.current_epoch
    candidates["step"] = int(candidates["step"]) if "step" in candidates else trainer.global_step
    return candidates


def score(trainer: Trainer, monitor: str | None, current: float) -> torch.Tensor:
    """A top-k save's score as Lightning keeps it: the logged tensor (its dtype and device), or
    ``current`` made one where it was replaced (a NaN ranks as the worst)."""
    logged = trainer.callback_metrics.get(monitor or "")
    if isinstance(logged, torch.Tensor) and float(logged) == current:
        return logged.detach().clone()
    return torch.tensor(current)


def missing_monitor_message(monitor: str, trainer: Trainer) -> str:
    """What to say when ``monitor`` is not among a save point's metrics, and how to fix it."""
    available = sorted(trainer.callback_metrics)
    return (f"ModelCheckpoint(monitor={monitor!r}) found no metric {monitor!r} in "
            f"trainer.callback_metrics{did_you_mean(monitor, available)}; available: {available}. "
            f"HINT: log it with self.log({monitor!r}, value) in your TrainModule.")
