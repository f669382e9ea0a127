"""Turn what ``configure_optimizers`` returns into optimisers and scheduler configs, and clip an
optimizer's gradients (``clip_gradients``: the Trainer's ``gradient_clip_val`` and ``self.clip_gradients``)."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from framework.errors import ConfigError


@dataclasses.dataclass
class LRSchedulerConfig:
    scheduler: Any
    interval: str = "epoch"  # "step" | "epoch"
    frequency: int = 1
    monitor: str | None = None
    name: str | None = None
    strict: bool = True


def parse_optimizers(result: Any) -> tuple[list[torch.optim.Optimizer], list[LRSchedulerConfig]]:
    """Accept an optimizer, a list of them, ``(optimizers, schedulers)``, or a dict with
    ``optimizer`` and ``lr_scheduler`` (a scheduler or ``{scheduler, interval, frequency,
    monitor, name}``) and, for a scheduler given bare, ``monitor`` (Lightning's rules: a
    ReduceLROnPlateau needs a monitor, there or in its own dict)."""
    if isinstance(result, torch.optim.Optimizer):
        return [result], []
    if isinstance(result, dict):
        if "optimizer" not in result:
            raise ConfigError("configure_optimizers() returned a dict without 'optimizer'")
        schedulers = [_scheduler_config(result["lr_scheduler"], result.get("monitor"))] if result.get("lr_scheduler") \
            else []
        return [result["optimizer"]], schedulers
    if isinstance(result, (list, tuple)):
        if len(result) == 2 and isinstance(result[0], (list, tuple)):
            return list(result[0]), [_scheduler_config(s) for s in result[1]]
        if all(isinstance(o, torch.optim.Optimizer) for o in result):
            return list(result), []
        if all(isinstance(o, dict) for o in result):
            pairs = [parse_optimizers(o) for o in result]
            return [o for p in pairs for o in p[0]], [s for p in pairs for s in p[1]]
    raise ConfigError(
        f"configure_optimizers() returned {type(result).__name__}; return an optimizer or "
        "{'optimizer': ..., 'lr_scheduler': ...}"
    )


def _scheduler_config(spec: Any, monitor: str | None = None) -> LRSchedulerConfig:
    if isinstance(spec, dict):
        if "scheduler" not in spec:
            raise ConfigError("lr_scheduler dict needs a 'scheduler' key")
        unknown = set(spec) - {f.name for f in dataclasses.fields(LRSchedulerConfig)}
        if unknown:
            raise ConfigError(f"lr_scheduler: unknown keys {sorted(unknown)}")
        config = LRSchedulerConfig(**spec)
    else:
        config = LRSchedulerConfig(scheduler=spec, monitor=monitor)
    if isinstance(config.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau) and config.monitor is None:
        raise ConfigError("configure_optimizers(): a ReduceLROnPlateau needs the metric it watches, as in Lightning: "
                          "{'optimizer': optimizer, 'lr_scheduler': scheduler, 'monitor': 'val_loss'} (or 'monitor' "
                          "in the lr_scheduler dict)")
    if config.interval not in ("step", "epoch"):
        raise ConfigError(f"lr_scheduler interval '{config.interval}': use 'step' or 'epoch'")
    if config.frequency < 1:
        raise ConfigError(f"lr_scheduler frequency {config.frequency}: must be >= 1")
    return config


def after_first_step(optimizer: torch.optim.Optimizer, fn: Any) -> None:
    """Call ``fn()`` once, after ``optimizer``'s first step. The hook stays registered and does
    nothing after: a hook may not remove itself while the optimizer runs its hooks (a second one
    would then find the hooks' dict changed under it)."""
    done = [False]

    def hook(_optimizer: torch.optim.Optimizer, _args: Any, _kwargs: Any) -> None:
        if not done[0]:
            done[0] = True
            fn()

    optimizer.register_step_post_hook(hook)


def clip_gradients(optimizer: torch.optim.Optimizer, value: float, algorithm: str) -> None:
    """Clip the gradients of ``optimizer``'s parameters to ``value`` by their total norm
    (``algorithm`` ``"norm"``) or elementwise (``"value"``); nothing for a value of 0 or less."""
    if value <= 0:
        return
    params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    if algorithm == "norm":
        torch.nn.utils.clip_grad_norm_(params, value)
    else:
        torch.nn.utils.clip_grad_value_(params, value)
