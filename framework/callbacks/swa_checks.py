"""What StochasticWeightAveraging refuses: its arguments when it is made, and at fit start the
set-ups it cannot serve (Lightning's rules, with the fix in each message)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from framework.errors import ConfigError, did_you_mean

if TYPE_CHECKING:
    from framework.module import TrainModule
    from framework.trainer import Trainer

_STRATEGIES = ("cos", "linear")


def check_arguments(swa_lrs: Any, swa_epoch_start: Any, annealing_epochs: Any, annealing_strategy: Any,
                    avg_fn: Any, device: Any) -> None:
    def positive(value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0

    if isinstance(swa_epoch_start, bool) or not isinstance(swa_epoch_start, (int, float)) or (
            swa_epoch_start < 1 if isinstance(swa_epoch_start, int) else not 0 <= swa_epoch_start <= 1):
        raise ConfigError(f"StochasticWeightAveraging(swa_epoch_start={swa_epoch_start!r}) must be an int >= 1 (an "
                          "epoch, counted from 1) or a float in [0, 1] (a fraction of max_epochs)")
    if not (positive(swa_lrs) or (isinstance(swa_lrs, list) and swa_lrs and all(positive(lr) for lr in swa_lrs))):
        raise ConfigError(f"StochasticWeightAveraging(swa_lrs={swa_lrs!r}) must be a positive float, or a list of "
                          "them (one per parameter group)")
    if isinstance(annealing_epochs, bool) or not isinstance(annealing_epochs, int) or annealing_epochs < 0:
        raise ConfigError(f"StochasticWeightAveraging(annealing_epochs={annealing_epochs!r}) must be an int >= 0")
    if annealing_strategy not in _STRATEGIES:
        raise ConfigError(f"StochasticWeightAveraging(annealing_strategy={annealing_strategy!r}) must be 'cos' or "
                          f"'linear'{did_you_mean(str(annealing_strategy), _STRATEGIES)}")
    if avg_fn is not None and not callable(avg_fn):
        raise ConfigError(f"StochasticWeightAveraging(avg_fn={avg_fn!r}) must be callable "
                          "(averaged, current, n_averaged) -> tensor")
    if device is not None and not isinstance(device, (torch.device, str)):
        raise ConfigError(f"StochasticWeightAveraging(device={device!r}) must be a torch.device, a string or None")


def check_fit(trainer: Trainer, module: TrainModule, swa_epoch_start: int | float) -> None:
    if not module.automatic_optimization:
        raise ConfigError("StochasticWeightAveraging needs automatic optimization (it replaces the scheduler the loop "
                          "steps); with self.automatic_optimization = False average the weights in training_step")
    if len(trainer.optimizers) != 1:
        raise ConfigError(f"StochasticWeightAveraging works with 1 optimizer; configure_optimizers() returned "
                          f"{len(trainer.optimizers)}")
    if len(trainer.lr_scheduler_configs) > 1:
        raise ConfigError(f"StochasticWeightAveraging replaces 1 scheduler; configure_optimizers() returned "
                          f"{len(trainer.lr_scheduler_configs)}")
    if isinstance(swa_epoch_start, float) and trainer.max_epochs == -1:
        raise ConfigError(f"StochasticWeightAveraging(swa_epoch_start={swa_epoch_start}) is a fraction of max_epochs, "
                          "which is -1 (no limit): give swa_epoch_start as an int epoch, or set trainer.max_epochs")
