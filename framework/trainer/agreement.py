"""What the ranks agree on at a run's set-up, carried by the one wait that set-up needs anyway.

After ``prepare_data`` (run once per node) every rank waits for the others, as in Lightning, so
that what it downloaded is there for all. fw makes that wait an all-reduce that also carries what
the ranks must agree on before the run starts, so that a set-up costs one collective, not four
(a barrier, a broadcast of two objects, an all-reduce; each is a wait for the slowest rank):

- how often the elastic agents restarted this job's workers: the largest count, because on
  several nodes the agent whose workers were healthy restarts them for the new round without
  counting it, so its ``TORCHELASTIC_RESTART_COUNT`` stays behind the others';
- whether rank 0 can write ``trainer.default_root_dir``: every rank raises the same error (a
  rank that raised alone would leave the others waiting in the next collective). The error's
  text goes to the others only when there is one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from framework.checkpointing.file import writable_error
from framework.waiting import waiting_in

if TYPE_CHECKING:
    from framework.trainer.run import Run


@dataclass(frozen=True)
class Agreement:
    """What every rank takes from set-up: the elastic restarts so far, and rank 0's complaint
    about ``default_root_dir`` (None when it can write there)."""

    restarts: int
    root_error: str | None


def agree(run: Run) -> Agreement:
    """Call on every rank after ``prepare_data``: no rank returns before every rank called it."""
    strategy = run.strategy
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0)
    error = writable_error(run.settings.default_root_dir, "trainer.default_root_dir") if strategy.is_global_zero else None
    if not strategy.is_distributed:
        return Agreement(restarts, error)
    with waiting_in("the set-up's barrier (after prepare_data)"):
        mine = torch.tensor([restarts, error is not None], dtype=torch.float64, device=strategy.collective_device)
        most_restarts, rank_0_failed = strategy.all_reduce(mine, "max").tolist()
    if rank_0_failed:
        error = strategy.broadcast(error)
    return Agreement(int(most_restarts), error)
