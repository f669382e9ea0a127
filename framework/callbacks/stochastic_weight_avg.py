"""Stochastic Weight Averaging (Izmailov et al., 2018), with Lightning's arguments and schedule.

From epoch ``swa_start`` (``swa_epoch_start``: a 1-based epoch, or a fraction of ``max_epochs``)
to the last, at the *start* of each epoch the weights are added to an equal-weight running average
(``torch.optim.swa_utils.AveragedModel``): the average holds the weights after epochs
``swa_start - 1`` to ``max_epochs - 2``, as in Lightning. At the first of those epochs a
``torch.optim.swa_utils.SWALR`` takes the place of the module's scheduler (or is added), annealing
each group's learning rate to ``swa_lrs`` over ``annealing_epochs`` epochs. When training ends the
module's parameters are set to the average.

A model with BatchNorm layers gets one more epoch (``max_epochs`` + 1 while the fit runs, as in
Lightning): at its start the module takes the average, its BatchNorm statistics are reset and
accumulated afresh (``momentum=None``: the plain mean over the epoch's batches) while the epoch
runs ``training_step`` alone, without backward or optimizer step; its validation sees the averaged
model. Under DDP each rank's statistics are then averaged over the ranks (before any validation
and at the epoch's end), so that every rank ends with the same model. Lightning 2.6 (not fw)
also counts one optimizer step at the end of that epoch, which, when no validation zeroed the
gradients before it, moves its weights off the average by the last training batch's gradients.

Checkpoints hold the average, the number of models in it, the SWALR state and the last epoch
averaged (Lightning's keys, in the callback's state); a fit resumed from one, even mid-epoch or
inside the BatchNorm epoch, ends with the weights of the fit never stopped (inside the BatchNorm
epoch under DDP, every rank goes on from rank 0's statistics so far: close, not bit for bit).
The checkpoint's ``lr_schedulers`` keep the state of the module's own scheduler, so that they
always match what ``configure_optimizers`` returns: SWALR comes back from the callback's state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from framework.callbacks import averaging
from framework.callbacks.base import Callback
from framework.callbacks.swa_checks import check_arguments, check_fit
from framework.errors import ConfigError
from framework.rank_zero import rank_zero_info, rank_zero_warn

if TYPE_CHECKING:
    from torch.optim.swa_utils import SWALR, AveragedModel

    from framework.module import TrainModule
    from framework.optim import LRSchedulerConfig
    from framework.trainer import Trainer

_CPU = torch.device("cpu")  # the default device of the average (Lightning's)


class StochasticWeightAveraging(Callback):
    """Average the weights of the last epochs, with an SWA learning-rate schedule (Lightning's).

    Args:
        swa_lrs: the SWA learning rate: one for every parameter group, or a list, one per group.
        swa_epoch_start: an int: averaging starts at that (1-based) epoch; a float in [0, 1]:
            at epoch ``int(swa_epoch_start * max_epochs)``.
        annealing_epochs: epochs over which each learning rate anneals to its ``swa_lrs``.
        annealing_strategy: ``"cos"`` or ``"linear"``.
        avg_fn: ``(averaged, current, n_averaged) -> new average``; default: equal weights.
        device: where the average is kept; None: the module's device.

    Raises:
        ConfigError: on an invalid argument; at fit start without exactly one optimizer, with more
            than one scheduler, in manual optimization, or with ``max_epochs=-1`` and a float
            ``swa_epoch_start``; under a sharded strategy.
    """

    def __init__(self, swa_lrs: float | list[float], swa_epoch_start: int | float = 0.8, annealing_epochs: int = 10,
                 annealing_strategy: str = "cos", avg_fn: Callable[..., torch.Tensor] | None = None,
                 device: torch.device | str | None = _CPU) -> None:
        check_arguments(swa_lrs, swa_epoch_start, annealing_epochs, annealing_strategy, avg_fn, device)
        self._swa_epoch_start = swa_epoch_start
        self._swa_lrs = swa_lrs
        self._annealing_epochs = annealing_epochs
        self._annealing_strategy = annealing_strategy
        self._avg_fn = avg_fn or self.avg_fn
        self._device = device
        self._start = swa_epoch_start if isinstance(swa_epoch_start, int) else 0  # resolved at fit start
        self._max_epochs = -1
        self._average: AveragedModel | None = None
        self._has_batch_norm = False
        self._bumped = False  # max_epochs + 1 for the BatchNorm epoch, undone when training ends
        self._reset_fit_state()
        self.momenta: dict[nn.modules.batchnorm._BatchNorm, float | None] = {}

    def _reset_fit_state(self) -> None:
        self._initialized = False
        self._swa_scheduler: SWALR | None = None
        self._displaced: LRSchedulerConfig | None = None  # the module's scheduler config SWALR replaced
        self._latest_update_epoch = -1
        self._loaded: dict[str, Any] | None = None  # a checkpoint's state, applied once the module is set up
        self._bn_update_started = False  # inside the BatchNorm epoch (a checkpoint written there resumes it)

    # -- Lightning's names ------------------------------------------------------------------------
    @property
    def swa_start(self) -> int:
        """The first epoch (0-based) whose start adds to the average."""
        return max(self._start - 1, 0)

    @property
    def swa_end(self) -> int | float:
        """The last epoch (0-based) of training proper (``inf`` with ``max_epochs=-1``)."""
        return float("inf") if self._max_epochs == -1 else self._max_epochs - 1

    @property
    def n_averaged(self) -> torch.Tensor | None:
        """How many models the average holds (None before the fit sets it up)."""
        return None if self._average is None else self._average.n_averaged

    @staticmethod
    def avg_fn(averaged: torch.Tensor, current: torch.Tensor, num_averaged: torch.Tensor) -> torch.Tensor:
        """The equal-weight running mean: ``averaged + (current - averaged) / (num_averaged + 1)``."""
        return averaged + (current - averaged) / (num_averaged + 1)

    @staticmethod
    def pl_module_contains_batch_norm(module: nn.Module) -> bool:
        return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in module.modules())

    # -- hooks ------------------------------------------------------------------------------------
    def setup(self, trainer: Trainer, module: TrainModule, stage: str) -> None:
        if stage != "fit":
            return
        averaging.refuse_sharded(trainer, "StochasticWeightAveraging")
        trainer.set_forward_only(False)
        self._reset_fit_state()
        # copied here, before the strategy moves and wraps the module, as Lightning copies it
        self._average = averaging.averaged_copy(module, None, avg_fn=self._avg_fn, use_buffers=False)

    def on_fit_start(self, trainer: Trainer, module: TrainModule) -> None:
        check_fit(trainer, module, self._swa_epoch_start)
        if isinstance(self._swa_epoch_start, float):
            self._start = int(trainer.max_epochs * self._swa_epoch_start)
        self._max_epochs = trainer.max_epochs
        self._has_batch_norm = self.pl_module_contains_batch_norm(module)
        if self._has_batch_norm and self._max_epochs != -1:
            trainer.add_epochs(1)  # the BatchNorm epoch
            self._bumped = True
        assert self._average is not None, "setup('fit') made it"
        self._average = averaging.conform(self._average, module, self._device, avg_fn=self._avg_fn, use_buffers=False)
        if self._loaded is not None:
            self._average.module.load_state_dict(self._loaded["average_model_state"])
            self._average.n_averaged.fill_(int(self._loaded["n_averaged"]))

    def on_train_epoch_start(self, trainer: Trainer, module: TrainModule) -> None:
        epoch = trainer.current_epoch
        averaging_now = self.swa_start <= epoch <= self.swa_end
        if averaging_now and not self._initialized:
            self._initialized = True
            self._take_over_the_schedule(trainer)
        assert self._average is not None, "setup('fit') made it"
        if averaging_now and epoch > self._latest_update_epoch:
            self._average.update_parameters(module)
            self._latest_update_epoch = epoch
        if self._bumped and epoch == self.swa_end + 1:
            self._begin_batch_norm_epoch(trainer, module)

    def _take_over_the_schedule(self, trainer: Trainer) -> None:
        """SWALR in the place of the module's scheduler (or added), as in Lightning."""
        from torch.optim.swa_utils import SWALR

        from framework.optim import LRSchedulerConfig

        optimizer = trainer.optimizers[0]
        groups = optimizer.param_groups
        lrs = [float(self._swa_lrs)] * len(groups) if not isinstance(self._swa_lrs, list) else self._swa_lrs
        if len(lrs) != len(groups):
            raise ConfigError(f"StochasticWeightAveraging(swa_lrs={self._swa_lrs!r}) gives {len(lrs)} learning rates "
                              f"for an optimizer with {len(groups)} parameter groups: give one per group, or one float")
        for lr, group in zip(lrs, groups, strict=True):
            group["initial_lr"] = lr
        swa_lr: Any = lrs  # SWALR takes one per group (its annotation says a float)
        strategy: Any = self._annealing_strategy
        self._swa_scheduler = SWALR(optimizer, swa_lr=swa_lr, anneal_epochs=self._annealing_epochs,
                                    anneal_strategy=strategy,
                                    last_epoch=trainer.max_epochs if self._annealing_strategy == "cos" else -1)
        if self._loaded is not None and self._loaded.get("scheduler_state") is not None:
            self._swa_scheduler.load_state_dict(self._loaded["scheduler_state"])
        elif trainer.current_epoch != self.swa_start:
            rank_zero_warn("StochasticWeightAveraging starts after swa_start without a checkpoint's SWA state: the "
                           "average and the SWA schedule begin now")
        self._displaced = displaced = trainer.swap_lr_scheduler(LRSchedulerConfig(self._swa_scheduler))
        if displaced is not None:
            if displaced.interval != "epoch" or displaced.frequency != 1:
                rank_zero_warn(f"StochasticWeightAveraging steps its schedule once per epoch; the module's scheduler "
                               f"(interval={displaced.interval!r}, frequency={displaced.frequency}) is replaced")
            rank_zero_info(f"fw: StochasticWeightAveraging: {type(displaced.scheduler).__name__} is replaced by SWALR")

    def _begin_batch_norm_epoch(self, trainer: Trainer, module: TrainModule) -> None:
        """The average into the module, its BatchNorm statistics afresh; the epoch runs forward only."""
        assert self._average is not None, "setup('fit') made it"
        if not self._bn_update_started:  # a resume inside this epoch continues the statistics it saved
            self.transfer_weights(self._average.module, module)
            for layer in averaging.batch_norms(module):
                layer.reset_running_stats()
        self.momenta = {layer: layer.momentum for layer in averaging.batch_norms(module)}
        for layer in self.momenta:
            layer.momentum = None  # a cumulative mean over the epoch's batches
        self._bn_update_started = True
        trainer.set_forward_only(True)

    def on_validation_start(self, trainer: Trainer, module: TrainModule) -> None:
        if trainer.state.forward_only and not trainer.sanity_checking:
            averaging.average_batch_norms_over_ranks(trainer, module)

    def on_train_epoch_end(self, trainer: Trainer, module: TrainModule) -> None:
        if trainer.state.forward_only:
            averaging.average_batch_norms_over_ranks(trainer, module)
            self.reset_momenta()
            self._bn_update_started = False

    def on_train_end(self, trainer: Trainer, module: TrainModule) -> None:
        done = trainer.current_epoch  # the epochs run
        self._end_fit(trainer)
        if self._has_batch_norm and self._max_epochs != -1 and done - 1 == self.swa_end + 1:
            return  # the BatchNorm epoch gave the module the average
        averaged = self._average is not None and int(self._average.n_averaged) > 0
        if averaged and (done - 1 == self.swa_end or self._max_epochs == -1):
            assert self._average is not None
            self.transfer_weights(self._average.module, module)
        elif averaged:
            rank_zero_info(f"fw: StochasticWeightAveraging: the fit stopped after epoch {done - 1}, before the last "
                           f"epoch ({self.swa_end}): the module keeps its trained weights, not the average")

    def on_exception(self, trainer: Trainer, module: TrainModule, exception: BaseException) -> None:
        self._end_fit(trainer)

    def _end_fit(self, trainer: Trainer) -> None:
        trainer.set_forward_only(False)
        self.reset_momenta()
        if self._bumped:
            trainer.add_epochs(-1)
            self._bumped = False

    @staticmethod
    def transfer_weights(src: nn.Module, dst: nn.Module) -> None:
        """``dst``'s parameters set to ``src``'s (buffers stay)."""
        averaging.copy_into(src, dst, buffers=False)

    def reset_momenta(self) -> None:
        for layer, momentum in self.momenta.items():
            layer.momentum = momentum
        self.momenta = {}

    # -- checkpoints ------------------------------------------------------------------------------
    def on_save_checkpoint(self, trainer: Trainer, module: TrainModule, checkpoint: dict[str, Any]) -> None:
        """The file's ``lr_schedulers`` are the module's own (the one SWALR replaced): a resume
        loads them into what ``configure_optimizers`` returns; SWALR is in this callback's state."""
        if self._swa_scheduler is not None and "lr_schedulers" in checkpoint:
            checkpoint["lr_schedulers"] = [] if self._displaced is None else [self._displaced.scheduler.state_dict()]

    def state_dict(self) -> dict[str, Any]:
        average = self._average
        return {"n_averaged": 0 if average is None else int(average.n_averaged),
                "latest_update_epoch": self._latest_update_epoch,
                "scheduler_state": None if self._swa_scheduler is None else self._swa_scheduler.state_dict(),
                "average_model_state": None if average is None else average.module.state_dict(),
                "bn_update_started": self._bn_update_started}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._latest_update_epoch = state["latest_update_epoch"]
        self._bn_update_started = bool(state.get("bn_update_started", False))
        if state.get("average_model_state") is not None:
            self._loaded = state
