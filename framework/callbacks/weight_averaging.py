"""Weight averaging after each optimizer step (EMA, or SWA by step), Lightning's ``WeightAveraging``.

``WeightAveraging`` keeps a ``torch.optim.swa_utils.AveragedModel`` of the module and updates it
after every optimizer step (and optionally at epoch ends) for which ``should_update`` says yes;
its keyword arguments go to ``AveragedModel`` (``avg_fn``, ``multi_avg_fn``), and by default it
averages the buffers too (``use_buffers=True``). ``EMAWeightAveraging`` is the exponential
moving average (``decay``), updated every ``update_every_n_steps`` steps from
``update_starting_at_step`` (or at the end of epochs from ``update_starting_at_epoch``).

As in Lightning: validation runs with the averaged weights (swapped in at each validation epoch's
start and out at its end), training ends with the module holding the average (before the first
update there is no average yet: validation and the end of training keep the module's own weights,
where Lightning would put in the copy of the initial weights), and a checkpoint
holds the average under ``state_dict`` (what ``validate``/``test``/``predict`` load), the
module's own weights under ``current_model_state`` and the average's count under
``averaging_state``; a fit resumed from it continues both. Under DDP every rank averages its own
copy of the parameters, which DDP keeps equal, so the averaged weights are the same on every rank
(averaged buffers such as BatchNorm statistics are each rank's, as the module's own are under DDP).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch.optim.swa_utils import get_ema_avg_fn

from framework.callbacks import averaging
from framework.callbacks.base import Callback
from framework.errors import ConfigError
from framework.rank_zero import rank_zero_info, rank_zero_warn

if TYPE_CHECKING:
    from torch.optim.swa_utils import AveragedModel

    from framework.module import TrainModule
    from framework.trainer import Trainer


class WeightAveraging(Callback):
    """Average the module's weights over the optimizer steps (and epochs) ``should_update`` picks.

    Args:
        device: where the average is kept; None: the module's device.
        use_buffers: average the buffers too (BatchNorm statistics); ``False`` keeps the copy's
            buffers as they were when it was made (update them with ``torch.optim.swa_utils.update_bn``).
        kwargs: ``AveragedModel``'s other arguments: ``avg_fn`` or ``multi_avg_fn`` (default: the
            equal-weight mean, SWA).
    """

    def __init__(self, device: torch.device | str | int | None = None, use_buffers: bool = True,
                 **kwargs: Any) -> None:
        self._device = torch.device(device) if isinstance(device, str) else device
        self._use_buffers = use_buffers
        self._kwargs = kwargs
        self._average_model: AveragedModel | None = None
        # optimizer steps taken at the last update: the first update comes after the first step
        self._latest_update_step = 0
        self._latest_update_epoch = -1

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        """Update after optimizer step ``step_idx`` / at the end of epoch ``epoch_idx`` (0-based)?
        Override to choose; the default updates after every step."""
        return step_idx is not None

    def _averaged_kwargs(self) -> dict[str, Any]:
        return {"use_buffers": self._use_buffers, **self._kwargs}

    # -- hooks ------------------------------------------------------------------------------------
    def setup(self, trainer: Trainer, module: TrainModule, stage: str) -> None:
        if stage == "fit":
            averaging.refuse_sharded(trainer, type(self).__name__)
            self._average_model = averaging.averaged_copy(module, self._device, **self._averaged_kwargs())

    def on_fit_start(self, trainer: Trainer, module: TrainModule) -> None:
        self._conform(module)

    def _conform(self, module: TrainModule) -> AveragedModel:
        assert self._average_model is not None, "setup('fit') made it"
        self._average_model = averaging.conform(self._average_model, module, self._device, **self._averaged_kwargs())
        return self._average_model

    def on_train_batch_end(self, trainer: Trainer, module: TrainModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        step_idx = trainer.global_step - 1  # 0-based, like epoch_idx
        if trainer.global_step > self._latest_update_step and self.should_update(step_idx=step_idx):
            assert self._average_model is not None, "setup('fit') made it"
            self._average_model.update_parameters(module)
            self._latest_update_step = trainer.global_step

    def on_train_epoch_end(self, trainer: Trainer, module: TrainModule) -> None:
        if trainer.current_epoch > self._latest_update_epoch and self.should_update(epoch_idx=trainer.current_epoch):
            assert self._average_model is not None, "setup('fit') made it"
            self._average_model.update_parameters(module)
            self._latest_update_epoch = trainer.current_epoch

    def _averaged(self) -> bool:
        """Has the average taken in any model yet (before, it is a copy of the initial weights)?"""
        return self._average_model is not None and int(self._average_model.n_averaged) > 0

    def on_train_end(self, trainer: Trainer, module: TrainModule) -> None:
        if self._averaged():
            assert self._average_model is not None
            averaging.copy_into(self._average_model.module, module, buffers=True)
        else:
            rank_zero_warn(f"{type(self).__name__}: no update was due during the fit (should_update never said yes): "
                           "the module keeps its trained weights")

    def on_validation_epoch_start(self, trainer: Trainer, module: TrainModule) -> None:
        if self._averaged():
            assert self._average_model is not None
            averaging.swap(self._average_model.module, module)

    def on_validation_epoch_end(self, trainer: Trainer, module: TrainModule) -> None:
        if self._averaged():
            assert self._average_model is not None
            averaging.swap(self._average_model.module, module)

    # -- checkpoints ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"latest_update_step": self._latest_update_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._latest_update_step = state["latest_update_step"]

    def on_save_checkpoint(self, trainer: Trainer, module: TrainModule, checkpoint: dict[str, Any]) -> None:
        """The average under ``state_dict``, the module's weights under ``current_model_state``."""
        if self._average_model is None:
            rank_zero_info(f"fw: {type(self).__name__}: a checkpoint outside fit holds no average; once training has "
                           "ended the module's weights are the average")
            return
        average = self._average_model.state_dict()
        checkpoint["current_model_state"] = checkpoint["state_dict"]
        checkpoint["state_dict"] = {name[7:]: value for name, value in average.items() if name.startswith("module.")}
        checkpoint["averaging_state"] = {name: value for name, value in average.items() if not name.startswith("module.")}

    def on_load_checkpoint(self, trainer: Trainer, module: TrainModule, checkpoint: dict[str, Any]) -> None:
        """The average from ``state_dict``, the module's weights from ``current_model_state`` (the
        module has just loaded ``state_dict``: the average)."""
        if self._average_model is None:
            rank_zero_warn(f"{type(self).__name__}: loading a checkpoint outside fit: the average is not restored "
                           "(the module loads the averaged weights)")
            return
        average = self._conform(module)
        if "current_model_state" in checkpoint and "averaging_state" in checkpoint:
            state = {"module." + name: value for name, value in checkpoint["state_dict"].items()}
            average.load_state_dict({**state, **checkpoint["averaging_state"]})
            module.load_state_dict(checkpoint["current_model_state"], strict=getattr(module, "strict_loading", True))
        else:
            rank_zero_warn(f"{type(self).__name__}: the checkpoint was not written with weight averaging: the average "
                           "starts from its weights")
            average.module.load_state_dict(checkpoint["state_dict"], strict=False)


class EMAWeightAveraging(WeightAveraging):
    """The exponential moving average of the weights: ``decay * average + (1 - decay) * current``.

    Args:
        device, use_buffers: as ``WeightAveraging``'s.
        decay: the weight of the average so far, in [0, 1].
        update_every_n_steps: update after every n-th optimizer step (0: never by step).
        update_starting_at_step: the first step index (0-based) that updates; None: from the first.
        update_starting_at_epoch: also update at the end of each epoch from this one (0-based);
            None: not at epoch ends.
        kwargs: ``AveragedModel``'s other arguments.

    Raises:
        ConfigError: ``decay`` outside [0, 1] or ``update_every_n_steps`` below 0.
    """

    def __init__(self, device: torch.device | str | int | None = None, use_buffers: bool = True, decay: float = 0.999,
                 update_every_n_steps: int = 1, update_starting_at_step: int | None = None,
                 update_starting_at_epoch: int | None = None, **kwargs: Any) -> None:
        if not 0.0 <= decay <= 1.0:
            raise ConfigError(f"EMAWeightAveraging(decay={decay!r}) must be in [0, 1] (the weight of the average so far)")
        if update_every_n_steps < 0:
            raise ConfigError(f"EMAWeightAveraging(update_every_n_steps={update_every_n_steps!r}) must be >= 0 "
                              "(0: never by step)")
        super().__init__(device=device, use_buffers=use_buffers, **kwargs, avg_fn=get_ema_avg_fn(decay=decay))
        self.update_every_n_steps = update_every_n_steps
        self.update_starting_at_step = update_starting_at_step
        self.update_starting_at_epoch = update_starting_at_epoch

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        if step_idx is not None:
            from_step = self.update_starting_at_step is None or step_idx >= self.update_starting_at_step
            if from_step and self.update_every_n_steps > 0 and step_idx % self.update_every_n_steps == 0:
                return True
        return epoch_idx is not None and self.update_starting_at_epoch is not None \
            and epoch_idx >= self.update_starting_at_epoch
