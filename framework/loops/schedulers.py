"""Learning-rate schedulers, stepped where Lightning steps them, through ``lr_scheduler_step``.

- ``interval="step"``: after each optimizer step; ``frequency`` counts batches of the epoch
  (``(batch_idx + 1) % frequency``), as Lightning's does.
- ``interval="epoch"``: on the epoch's last batch, before its ``on_train_batch_end`` and the
  epoch-end validation; an epoch cut short by a stop does not step them.
- ``ReduceLROnPlateau`` reads its monitored metric, so it steps after the metrics exist: after
  the batch's validation (``step``) or after ``on_train_epoch_end`` (``epoch``).

In manual optimization the module steps its schedulers itself (``self.lr_schedulers()``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from framework.errors import ConfigError
from framework.intervals import every
from framework.rank_zero import rank_zero_warn

if TYPE_CHECKING:
    from framework.optim import LRSchedulerConfig
    from framework.trainer.run import Run


def step_schedulers(run: Run, interval: str, plateau: bool, batch_idx: int = 0) -> None:
    """Step the ``interval`` schedulers that are due: the plateau ones, or the others (none in an
    epoch without optimizer steps: ``trainer.state.forward_only``)."""
    if run.manual is not None or run.state.forward_only:
        return
    count = batch_idx + 1 if interval == "step" else run.state.epoch + 1
    for cfg in run.lr_scheduler_configs:
        if cfg.interval != interval or not every(cfg.frequency, count):
            continue
        if isinstance(cfg.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau) != plateau:
            continue
        metric = _monitored(run, cfg) if plateau else None
        if plateau and metric is None:
            continue
        run.hooks.module_hook("lr_scheduler_step", cfg.scheduler, metric)


def _monitored(run: Run, cfg: LRSchedulerConfig) -> torch.Tensor | None:
    monitor = cfg.monitor
    assert monitor is not None, "parse_optimizers refuses a ReduceLROnPlateau without a monitor"
    metrics = run.metrics.callback_metrics
    if monitor in metrics:
        return metrics[monitor]
    if cfg.strict:
        raise ConfigError(f"lr_scheduler monitor '{monitor}' was not logged; logged: "
                          f"{', '.join(sorted(metrics)) or 'none'}; log it or set the scheduler's monitor")
    rank_zero_warn(f"lr_scheduler monitor '{monitor}' was not logged (strict=False): its scheduler does not step")
    return None
