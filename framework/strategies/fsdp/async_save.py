"""An asynchronous sharded save (FSDP's ``async_save=True``): training goes on while the shards
are written.

``dcp.async_save`` copies each rank's tensors into CPU memory (the only time training waits,
besides ``fw_state.pt``, which is small) and writes them in a thread, over a Gloo group of its
own (the training's collectives keep the default group). The commit needs every rank's shards
on disk, and no collective may run from that thread: each rank's thread drops a mark
``.written-<rank>`` into the folder when its write succeeded, and a thread on rank 0 commits
(``COMMITTED``, then the rename) once all marks are there. Until then the checkpoint is not
under its name, so an elastic restart after a kill resumes from the one before.

The next save, and the end of the call (``teardown``), wait for the pending one: a fit returns
with its last checkpoint committed, and a failed write is raised there.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from framework.errors import CheckpointError

if TYPE_CHECKING:
    from concurrent.futures import Future

    from framework.strategies.fsdp import FSDPStrategy


class PendingSave:
    """One asynchronous save in flight on this rank (see the module docstring)."""

    def __init__(self, future: Future, partial: Path, rank: int, world_size: int, timeout: float,
                 commit: Callable[[], None]) -> None:
        self.future, self.partial, self.started = future, partial, time.monotonic()
        self.error: BaseException | None = None
        future.add_done_callback(lambda done: self._mark(done, rank))
        self.committer: threading.Thread | None = None
        if rank == 0:
            self.committer = threading.Thread(target=self._commit_when_written, args=(world_size, timeout, commit),
                                              name="fw-checkpoint-commit", daemon=True)
            self.committer.start()

    def _mark(self, done: Future, rank: int) -> None:
        if done.exception() is None:
            (self.partial / f".written-{rank}").touch()

    def _commit_when_written(self, world_size: int, timeout: float, commit: Callable[[], None]) -> None:
        try:
            deadline = time.monotonic() + timeout
            while not all((self.partial / f".written-{r}").exists() for r in range(world_size)):
                if self.future.done() and self.future.exception() is not None:
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError(f"not every rank wrote its shards within {timeout:g} s")
                time.sleep(0.01)
            for r in range(world_size):
                (self.partial / f".written-{r}").unlink()
            commit()
        except BaseException as err:  # raised on the main thread at the next wait
            self.error = err

    def wait(self) -> float:
        """Block until this rank's part is written (on rank 0: committed); the seconds waited.

        Raises:
            CheckpointError: the write or the commit failed (earlier checkpoints are intact).
        """
        start = time.monotonic()
        failure = self.future.exception()
        if self.committer is not None:
            self.committer.join()
            failure = failure or self.error
        if failure is not None:
            raise CheckpointError(f"the asynchronous checkpoint '{self.partial}' was not written "
                                  f"({type(failure).__name__}: {failure}); earlier checkpoints are intact") from None
        return time.monotonic() - start


def checkpoint_group(strategy: FSDPStrategy) -> Any:
    """The Gloo group asynchronous saves coordinate over (made once, by every rank together)."""
    import torch.distributed as dist

    if strategy.checkpoint_group is None:
        strategy.checkpoint_group = dist.new_group(backend="gloo")
    return strategy.checkpoint_group


def finish_pending(strategy: FSDPStrategy, barrier: bool = True) -> None:
    """Wait for this rank's pending asynchronous save, if any (every rank, then a barrier, so
    that the next save or the end of the call sees it committed)."""
    pending, strategy.pending_save = strategy.pending_save, None
    if pending is None:
        return
    pending.wait()
    if barrier:
        strategy.barrier("asynchronous checkpoint committed")
