"""A ``trainer.save_checkpoint()`` after a distributed fit returned: what it writes for every rank.

The checkpoint is to hold every rank's RNG states as the fit ended, as one written during the fit
does, so that a fit resumed from it on the same ranks continues bit for bit, whatever ran between
(a ``validate`` draws random numbers). So at the end of a distributed fit each rank keeps its
per-rank states (``keep``). Where the process group stays up after the fit (one made before it,
by the user's script), the save gathers them then. Where it goes with the fit (fw made it), the
ranks can no longer gather later: rank 0 keeps every rank's states, gathered while the group is
up (one gather of a few kilobytes). Under ``ddp_spawn``/``ddp_notebook`` the workers are gone
too: rank 0's ``Outcome`` brings those states back to the calling process, with what only the
workers held (the optimizers' states, the schedulers', the callbacks', the loop's; the weights
come back on their own), and the caller's checkpoint is written from them (``use``).
Lightning's checkpoint after a fit holds rank 0's state alone.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import torch

from framework.accelerators.base import move_to_device
from framework.checkpointing.parts import EndOfFit, Value
from framework.checkpointing.single_file import is_live

if TYPE_CHECKING:
    from framework.checkpointing.parts import CheckpointParts
    from framework.trainer.run import Run


def keep(run: Run, parts: CheckpointParts) -> None:
    """At the end of a fit that ended normally, while its group is up (every rank calls it):
    each rank keeps its per-rank states of ``parts`` (the fit's checkpoint parts) where the
    group stays up; else rank 0 keeps every rank's."""
    strategy = run.strategy
    if not is_live(strategy):
        return
    if strategy.group_outlives_teardown:
        run.end_of_fit = EndOfFit(None, own=parts.rank_states())
        return
    per_rank = strategy.all_gather_object(parts.rank_states())
    if strategy.is_global_zero:
        run.end_of_fit = EndOfFit(per_rank)


def brought_back(run: Run, parts: CheckpointParts) -> EndOfFit | None:
    """On a spawned fit's rank 0: what it kept, with the values and shared states the caller
    lacks (all on the CPU), for the ``Outcome``; None elsewhere."""
    kept = run.end_of_fit
    if kept is None or kept.per_rank is None:
        return None
    shared = parts.shared_states()
    shared.pop("state_dict", None)  # the weights come back in the Outcome's state_dict
    cpu = torch.device("cpu")
    return EndOfFit(move_to_device(kept.per_rank, cpu), dict(parts.values), move_to_device(shared, cpu))


def use(kept: EndOfFit | None, parts: CheckpointParts) -> None:
    """Let ``parts`` (of a Run after the fit) write what ``kept`` holds: this rank's or every
    rank's per-rank states and, brought back from workers, their shared states and values."""
    if kept is None:
        return
    parts.kept_per_rank, parts.kept_own = kept.per_rank, kept.own
    if kept.shared is not None:
        parts.shared.update({key: Value.saved_only(functools.partial(_same, state)) for key, state in kept.shared.items()})
    if kept.values is not None:
        parts.values.update(kept.values)


def _same(state: Any) -> Any:
    return state
