"""Where a resumed fit continues (``ResumePoint``), and which checkpoints it refuses to continue.

A mid-epoch checkpoint keeps its data position as a count of batches per rank. That count
means the same samples only for the same number of ranks and the same per-rank batch size:
resumed on another number of ranks, the skipped batches are other samples than the ones
already trained on (2 ranks resumed on 1 trained 12 of 64 samples twice in that epoch; 1 rank
resumed on 2 skipped 12; a shuffled run also reads another order). Until the position is kept
in samples of the global order, such a resume is refused (``check_position_carries_over``).
At an epoch end there is no position to map: such a checkpoint resumes on any number of ranks
(with the same global batch, within float noise of the run that was never stopped).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from framework.data import skipping_first_batches
from framework.errors import CheckpointError
from framework.rank_zero import rank_zero_warn
from framework.seed import set_rng_state

if TYPE_CHECKING:
    from framework.trainer.run import Run

_AT_AN_EPOCH_END = ("resume from a checkpoint written at an epoch end (ModelCheckpoint's end-of-epoch "
                    "checkpoint: its default, without every_n_train_steps)")


def _ranks(n: int) -> str:
    return f"{n} rank" if n == 1 else f"{n} ranks"


@dataclass
class ResumePoint:
    """Where a resumed fit continues: the RNG state to put back once the sanity check has run,
    and on a mid-epoch resume the batches to skip and the RNG state after them."""

    rng: dict
    batches: int = 0
    rng_after_skip: dict | None = None
    metrics: dict | None = None  # the epoch's running aggregates (see MetricCollector.state_dict)
    loader_state: dict | None = None  # a stateful training loader's own state_dict()

    def restore_rng(self) -> None:
        set_rng_state(self.rng)

    def iterate_from_position(self, loader: Any) -> Iterator:
        """An iterator over ``loader`` that starts after the batches already trained on, and
        the RNG state the checkpoint had at that point. A loader with ``load_state_dict`` (such
        as torchdata's StatefulDataLoader) resumes itself; a DataLoader skips the batches by
        their indices alone (see ``skipping_first_batches``); anything else draws and drops them."""
        if self.loader_state is not None and callable(getattr(loader, "load_state_dict", None)):
            loader.load_state_dict(self.loader_state)
            iterator = iter(loader)
        else:
            skipping = skipping_first_batches(loader, self.batches)
            iterator = iter(skipping if skipping is not None else loader)
            if skipping is not None:
                skipping.batch_sampler.started.skip()  # the sampler draws now, as it did then
            else:
                for _ in range(self.batches):
                    next(iterator)
        if self.rng_after_skip is not None:
            set_rng_state(self.rng_after_skip)
        return iterator


def train_batch_size(run: Run) -> int | None:
    """The per-rank batch size of the training loader, when it has one (what a mid-epoch
    checkpoint's batch count is counted in)."""
    loaders = run.loaders.get("train") or []
    size = getattr(loaders[0], "batch_size", None) if loaders else None
    return size if isinstance(size, int) else None


def check_position_carries_over(run: Run, checkpoint: dict, path: str) -> None:
    """Refuse a mid-epoch checkpoint whose data position means other samples in this run.

    Raises:
        CheckpointError: the checkpoint stopped mid-epoch on another number of ranks, or with
            another per-rank training batch size, than this run has.
    """
    loop = checkpoint.get("loop") or {}
    batches, epoch = int(loop.get("batches_done") or 0), loop.get("epoch")
    if loop.get("epoch_finished", True) or batches == 0:
        return  # at an epoch boundary: the next epoch's order does not depend on the ranks
    saved_ranks = int(checkpoint.get("world_size") or len(checkpoint.get("rng") or ()) or 1)
    where = f"ckpt_path '{path}': the checkpoint stopped mid-epoch (epoch {epoch}, after {batches} batches per rank)"
    why = "the data position cannot be mapped exactly (samples would be trained twice or skipped)"
    if saved_ranks != run.strategy.world_size:
        raise CheckpointError(
            f"{where} on {_ranks(saved_ranks)}, and this run has {run.strategy.world_size}: {why}. Resume on "
            f"{_ranks(saved_ranks)} (trainer.devices * trainer.num_nodes = {saved_ranks}), or {_AT_AN_EPOCH_END}"
        )
    if run.settings.reload_dataloaders_every_n_epochs:
        return  # the loader of the resumed epoch is built later (its batch size may differ per epoch)
    saved_batch, batch = checkpoint.get("train_batch_size"), train_batch_size(run)
    if saved_batch is not None and batch is not None and saved_batch != batch:
        raise CheckpointError(
            f"{where} with {saved_batch} samples per batch per rank, and this run's training batch size is {batch}: "
            f"{why}. Resume with batch size {saved_batch}, or {_AT_AN_EPOCH_END}"
        )


def resume_point(run: Run, mine: dict[str, Any], ranks: int) -> ResumePoint:
    """This rank's RNG states (``mine``: its per-rank parts, ``rng``, ``metrics``,
    ``loader_states``, from a file written by ``ranks`` ranks); mid-epoch, first the
    epoch-start state (to rebuild the same data order), and the saved state once the batches
    already done are skipped. (A mid-epoch checkpoint from another number of ranks was refused
    before: ``check_position_carries_over``.)"""
    if ranks != run.strategy.world_size:
        rank_zero_warn(
            f"checkpoint was written by {ranks} rank(s), this run has {run.strategy.world_size}: "
            "RNG states are reused from rank 0, so the run will not be bit-identical; resume with "
            f"{ranks} process(es) for an exact resume"
        )
    rng, metrics, loader = mine["rng"], mine.get("metrics"), mine.get("loader_states")
    batches = run.state.batches_done
    if batches and rng["epoch_start"] is not None:
        return ResumePoint(rng["epoch_start"], batches, rng["now"], metrics, loader)
    return ResumePoint(rng["now"], batches, metrics=metrics, loader_state=loader)
