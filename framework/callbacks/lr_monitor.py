"""Log the learning rate (and optionally the momentum and weight decay) of every optimizer.

Names: ``lr-<OptimizerClass>`` or the scheduler config's ``name``; with several parameter
groups ``/pg1``, ``/pg2``... (or a group's own ``"name"``, also where it is the only group); a
repeated name gets ``-1``, ``-2``. Momentum is logged as ``<name>-momentum`` (SGD's ``momentum``,
or ``betas[0]`` for Adam-likes), weight decay as ``<name>-weight_decay``, each after the group's
suffix (``lr-SGD/pg2-momentum``), as Lightning names them.

With ``logging_interval=None`` each scheduler is logged at its own interval (at step rows for
``interval="step"``, at epoch starts otherwise) and optimizers without a scheduler at both;
``"step"`` or ``"epoch"`` logs all of them at that interval. Step rows are Lightning's: at the
start of a batch whose step is a logging one (``(step + 1) % trainer.log_every_n_steps == 0``, or
the fit stops), under gradient accumulation at each batch of that step (the same row again, as
Lightning writes it).

Values go to ``trainer.log_metrics`` (which writes on rank 0 only) and into
``trainer.callback_metrics`` on every rank. No collective is involved.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from framework.callbacks.base import Callback
from framework.errors import ConfigError, did_you_mean
from framework.intervals import every
from framework.rank_zero import rank_zero_warn

if TYPE_CHECKING:
    from framework.module import TrainModule
    from framework.trainer import Trainer

_INTERVALS = ("step", "epoch")


class LearningRateMonitor(Callback):
    """Log learning rates through the Trainer's loggers.

    Args:
        logging_interval: ``None`` (each scheduler at its own interval), ``"step"`` or ``"epoch"``.
        log_momentum: Also log the momentum of each parameter group.
        log_weight_decay: Also log the weight decay of each parameter group.

    Raises:
        ConfigError: On an unknown ``logging_interval``.
    """

    def __init__(self, logging_interval: str | None = None, log_momentum: bool = False,
                 log_weight_decay: bool = False) -> None:
        if logging_interval not in (None, *_INTERVALS):
            raise ConfigError(f"LearningRateMonitor(logging_interval={logging_interval!r}) must be None, "
                              f"'step' or 'epoch'{did_you_mean(logging_interval, _INTERVALS)}")
        self.logging_interval = logging_interval
        self.log_momentum, self.log_weight_decay = log_momentum, log_weight_decay
        # (name, optimizer, interval) per optimizer; resolved in on_train_start.
        self._tracked: list[tuple[str, torch.optim.Optimizer, str]] = []
        # Lightning's records: every learning rate logged, by name; the last momentum and weight decay
        self.lrs: dict[str, list[float]] = {}
        self.last_momentum_values: dict[str, float | None] = {}
        self.last_weight_decay_values: dict[str, float | None] = {}

    def on_train_start(self, trainer: Trainer, module: TrainModule) -> None:
        if not trainer.loggers:
            rank_zero_warn("LearningRateMonitor: the Trainer has no logger; learning rates only reach "
                           "trainer.callback_metrics. Give the Trainer a logger to record them")
        self._tracked = []
        used: dict[str, int] = {}
        scheduled = set()
        for config in trainer.lr_scheduler_configs:
            optimizer = config.scheduler.optimizer
            scheduled.add(id(optimizer))
            name = config.name or f"lr-{type(optimizer).__name__}"
            self._tracked.append((self._unique(name, used), optimizer, config.interval))
        for optimizer in trainer.optimizers:
            if id(optimizer) not in scheduled:  # logged at every step row and every epoch start
                name = f"lr-{type(optimizer).__name__}"
                self._tracked.append((self._unique(name, used), optimizer, "any"))
        names = [name + _suffix(opt.param_groups, i) for name, opt, _ in self._tracked for i in range(len(opt.param_groups))]
        self.lrs = {name: [] for name in names}
        self.last_momentum_values = {f"{name}-momentum": None for name in names}
        self.last_weight_decay_values = {f"{name}-weight_decay": None for name in names}

    @staticmethod
    def _unique(name: str, used: dict[str, int]) -> str:
        count = used.get(name, 0)
        used[name] = count + 1
        return name if count == 0 else f"{name}-{count}"

    def on_train_batch_start(self, trainer: Trainer, module: TrainModule, batch: Any, batch_idx: int) -> None:
        if self.logging_interval == "epoch":
            return
        step = trainer.state.batches_that_stepped  # Lightning's step for logged rows (manual: one per batch)
        # Lightning's rule: where the step about to be taken is a logging one (or the fit stops);
        # under gradient accumulation each batch of that step logs (the same values), as in Lightning
        n = getattr(trainer, "log_every_n_steps", 1)
        if not n or not (every(n, step + 1) or trainer.should_stop):
            return
        self._log(trainer, interval=None if self.logging_interval == "step" else "step")

    def on_train_epoch_start(self, trainer: Trainer, module: TrainModule) -> None:
        if self.logging_interval == "step":
            return
        self._log(trainer, interval=None if self.logging_interval == "epoch" else "epoch")

    def _log(self, trainer: Trainer, interval: str | None) -> None:
        """Log the tracked optimizers whose interval is ``interval`` (all of them if ``None``)."""
        stats = self.extract_stats(interval)
        if not stats:
            return
        trainer.add_callback_metrics({k: torch.tensor(v) for k, v in stats.items()})
        trainer.log_metrics(stats, step=trainer.state.batches_that_stepped)

    def extract_stats(self, interval: str | None = None) -> dict[str, float]:
        """Current learning rates (and momenta, weight decays) by logged name, Lightning's."""
        stats: dict[str, float] = {}
        for name, optimizer, opt_interval in self._tracked:
            if interval is not None and opt_interval not in (interval, "any"):
                continue
            groups = optimizer.param_groups
            for i, group in enumerate(groups):
                key = name + _suffix(groups, i)
                stats[key] = float(group["lr"])
                self.lrs.setdefault(key, []).append(stats[key])
                if self.log_momentum:
                    stats[f"{key}-momentum"] = self.last_momentum_values[f"{key}-momentum"] = _momentum(group)
                if self.log_weight_decay:
                    stats[f"{key}-weight_decay"] = float(group.get("weight_decay", 0.0))
                    self.last_weight_decay_values[f"{key}-weight_decay"] = stats[f"{key}-weight_decay"]
        return stats


def _suffix(groups: list[dict], i: int) -> str:
    """Lightning's: ``/<group's name>`` (``/pg<i+1>`` unnamed) where there are several groups, or
    the one group has a name."""
    named = groups[i].get("name")
    if len(groups) > 1:
        return f"/{named or f'pg{i + 1}'}"
    return f"/{named}" if named else ""


def _momentum(group: dict) -> float:
    if "betas" in group:
        return float(group["betas"][0])
    return float(group.get("momentum", 0.0))
