"""How a strategy without sharded state writes and reads a checkpoint: every rank's per-rank
parts are gathered, rank 0 writes one file (atomically: ``file.py``), and every
rank learns whether that write succeeded; on load every rank reads the file and loads its parts.

After a fit, the per-rank parts are those the fit ended with; where its process group is gone,
there is nobody to gather from or wait for: rank 0 writes what the fit kept of every rank
(``trainer/end_of_fit.py``). A strategy that shards its state (FSDP) writes its own way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch.distributed

from framework.checkpointing import file as ckpt
from framework.checkpointing import index as checkpoint_index
from framework.errors import CheckpointError
from framework.rank_zero import rank_zero_warn

if TYPE_CHECKING:
    from framework.checkpointing.parts import CheckpointParts
    from framework.strategies.base import Strategy


def is_live(strategy: Strategy) -> bool:
    """Is the job's process group up (collectives work now)?"""
    return strategy.is_distributed and torch.distributed.is_available() and torch.distributed.is_initialized()


def save_from_rank_zero(strategy: Strategy, path: str, parts: CheckpointParts) -> None:
    """Gather the per-rank parts, write on rank 0, then wait for it on every rank.

    Raises:
        CheckpointError: the write failed (on every rank, so that none goes on alone).
    """
    live = is_live(strategy)
    mine = parts.kept_own if parts.kept_own is not None else parts.rank_states()
    per_rank = strategy.all_gather_object(mine) if live else parts.kept_per_rank or [mine]
    if not live and parts.kept_per_rank is None and parts.per_rank and strategy.world_size > 1:
        rank_zero_warn(f"the checkpoint '{path}' holds rank 0's RNG state alone: no fit of this Trainer ended "
                       f"normally on its {strategy.world_size} ranks; a fit resumed from it draws other random "
                       "numbers on the other ranks (save during the fit, e.g. with ModelCheckpoint, for all of them)")
    error: Exception | None = None
    try:  # every rank assembles its checkpoint (its on_save_checkpoint hooks run, as in Lightning); rank 0's is written
        checkpoint = parts.assemble(per_rank if strategy.is_global_zero else [mine])
        if strategy.is_global_zero:
            ckpt.atomic_save(checkpoint, path)
            if path.endswith(".ckpt"):  # a file of its own (not a sharded checkpoint's fw_state.pt)
                checkpoint_index.note(path, checkpoint)
    except Exception as exc:  # disk full, permissions, a hook: the other ranks must not wait for it
        error = exc
    # every rank learns whether the write succeeded (this is also the barrier)
    if live and not strategy.reduce_boolean_decision(error is None, all=True) and error is None:
        raise CheckpointError(f"another rank failed while writing the checkpoint '{path}'; its own error says why")
    cause = _os_error(error)
    if cause is not None:  # full disk, no permission, a file where a folder should be
        raise CheckpointError(
            f"writing the checkpoint '{path}' failed ({type(cause).__name__}: {cause.strerror or cause}); "
            "earlier checkpoints are intact. Free space or pick a writable folder"
        ) from None
    if error is not None:
        raise error


def load_on_every_rank(strategy: Strategy, path: str, parts: CheckpointParts) -> dict[str, Any]:
    """Read ``path`` (every rank reads the one file) and load ``parts`` from it; the contents."""
    checkpoint = ckpt.load_checkpoint(path)
    parts.load(checkpoint, strategy.global_rank, strategy.world_size,
               (strategy.data_parallel_rank, strategy.data_parallel_size))
    return checkpoint


def _os_error(error: BaseException | None) -> OSError | None:
    """The OSError behind ``error`` (torch.save on a full disk raises its own error while
    handling the OSError), or None."""
    while error is not None and not isinstance(error, OSError):
        error = error.__cause__ or error.__context__
    return error
