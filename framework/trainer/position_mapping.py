"""How a checkpoint's data position carries over to the run that resumes it, or why it cannot.

A mid-epoch checkpoint says how many batches per rank of its epoch were trained. Read in the
global order (``data/global_order.py``: one order from the seed, whatever the number of ranks),
that is a number of samples: ``batches * batch_size * world_size`` of the epoch's order. So:

- the same shape (ranks and per-rank batch size) continues batch for batch, bit for bit;
- another shape continues at that sample of the same order (``Carry.samples``): 2 ranks × 8
  resumed on 1 × 16 or 4 × 4 trains exactly the samples still to train, in the same global
  batches, and ends within float noise of the run that was never stopped. With another global
  batch the run goes on from that sample, and fw says in one line what changed;
- a checkpoint whose run read the loader's own order (``use_distributed_sampler=False``, or fw
  before the global order) resumes mid-epoch only with that order and shape; one whose data set
  had another size, or another kind of order, is refused mid-epoch with the reason.

The order's seed is the checkpoint's: a resumed run continues the run it resumes, whatever seed
the resuming program set (as it continues the checkpoint's RNG states). At an epoch end there
is no position to map: such a checkpoint resumes on any shape.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from framework.checkpointing.file import data_ranks_that_wrote, ranks_that_wrote
from framework.data.global_order import GlobalOrderSampler
from framework.errors import CheckpointError
from framework.rank_zero import rank_zero_info

if TYPE_CHECKING:
    from framework.trainer.run import Run

_AT_AN_EPOCH_END = ("resume from a checkpoint written at an epoch end (ModelCheckpoint's end-of-epoch "
                    "checkpoint: its default, without every_n_train_steps)")


@dataclass(frozen=True)
class Carry:
    """Where a mid-epoch resume on another shape starts: ``samples`` of the epoch's order are done."""

    samples: int


def _ranks(n: int) -> str:
    return f"{n} rank" if n == 1 else f"{n} ranks"


def _train_loader(run: Run) -> Any:
    """The (first) training loader, or None."""
    loaders = run.loaders.get("train") or []
    return loaders[0] if loaders else None


def global_order(run: Run) -> GlobalOrderSampler | None:
    """The training loader's global order, when it reads one."""
    sampler = getattr(_train_loader(run), "sampler", None)
    return sampler if isinstance(sampler, GlobalOrderSampler) else None


def train_order(run: Run) -> dict[str, Any] | None:
    """What the training order depends on (a checkpoint's ``train_order``), or None for the
    loader's own order."""
    order = global_order(run)
    return order.describe() if order is not None else None


def train_batch_size(run: Run) -> int | None:
    """The per-rank batch size of the training loader, when it has one (what a mid-epoch
    checkpoint's batch count is counted in)."""
    size = getattr(_train_loader(run), "batch_size", None)
    return size if isinstance(size, int) else None


def continue_order(run: Run, checkpoint: dict) -> None:
    """The training order goes on with the checkpoint's seed (its loaders now and when reloaded)."""
    saved, order = checkpoint.get("train_order"), global_order(run)
    if not saved or order is None or saved["seed"] == order.seed:
        return
    rank_zero_info(f"fw: the training data order continues the checkpoint's (seed {saved['seed']}; this "
                   f"program's seed is {order.seed})")
    for loader in run.loaders.get("train") or []:
        if isinstance(getattr(loader, "sampler", None), GlobalOrderSampler):
            loader.sampler.seed = saved["seed"]
    if run.loader_source is not None:
        run.loader_source = dataclasses.replace(run.loader_source, seed=saved["seed"])


def check_position_carries_over(run: Run, checkpoint: dict, path: str) -> Carry | None:
    """How a mid-epoch checkpoint's position carries over (None: batch for batch, or nothing to
    carry at an epoch end).

    Raises:
        CheckpointError: the position means other samples in this run, and cannot be mapped.
    """
    loop = checkpoint.get("loop") or {}
    batches, epoch = int(loop.get("batches_done") or 0), loop.get("epoch")
    if loop.get("epoch_finished", True) or batches == 0:
        return None  # at an epoch boundary: the next epoch's order does not depend on the ranks
    saved_ranks, ranks = data_ranks_that_wrote(checkpoint), run.strategy.data_parallel_size
    saved_batch, batch = checkpoint.get("train_batch_size"), train_batch_size(run)
    where = f"ckpt_path '{path}': the checkpoint stopped mid-epoch (epoch {epoch}, after {batches} batches per rank)"
    saved_order, order = _saved_order(checkpoint), train_order(run)
    if saved_order != order:
        _refuse_other_order(where, saved_order, order)
    same_batch = run.settings.reload_dataloaders_every_n_epochs or None in (saved_batch, batch) or saved_batch == batch
    if saved_ranks == ranks and same_batch:
        return None
    if order is None or saved_order is None or "before" in saved_order or saved_batch is None or batch is None:
        _refuse_other_shape(where, saved_ranks, ranks, saved_batch, batch)  # not kept in samples of the global order
    assert saved_batch is not None and batch is not None
    samples, before, now = batches * saved_batch * saved_ranks, saved_batch * saved_ranks, batch * ranks
    change = "the same global batch" if before == now else f"the global batch changes from {before} to {now} samples"
    rank_zero_info(f"fw: resuming epoch {epoch} at sample {samples} of its order on {_ranks(ranks)} x {batch} "
                   f"(written on {_ranks(saved_ranks)} x {saved_batch}): {change}")
    return Carry(samples)


def _saved_order(checkpoint: dict) -> dict | None:
    """The order a checkpoint's run read: its ``train_order``; a file from before it was kept
    read DistributedSampler's on several ranks (the global order, with a seed it does not say:
    it continues on its own shape only), the loader's own on one."""
    if "train_order" in checkpoint:
        return checkpoint["train_order"]
    return {"before": "global"} if ranks_that_wrote(checkpoint) > 1 else None


def _refuse_other_order(where: str, saved: dict | None, order: dict | None) -> None:
    if saved is not None and saved.get("before") == "global" and order is not None:
        return  # DistributedSampler's order: the global one (its shape is checked next)
    if saved is None:
        raise CheckpointError(f"{where} reading the training loader's own order (use_distributed_sampler=False, or a "
                              "checkpoint from before fw's global order), and this run reads the global order: the "
                              "samples already trained on are other samples here. Resume with "
                              f"Trainer(use_distributed_sampler=False), or {_AT_AN_EPOCH_END}")
    if order is None:
        raise CheckpointError(f"{where} reading fw's global order, and this run's training loader keeps its own "
                              "(use_distributed_sampler=False, a custom batch_sampler, or a DataLoader subclass): "
                              f"resume with the loader the checkpoint was written with, or {_AT_AN_EPOCH_END}")
    differs = [f"{key} {saved.get(key)!r} there, {order[key]!r} here" for key in ("kind", "samples", "drop_last")
               if saved.get(key) != order[key]]
    if differs:
        raise CheckpointError(f"{where} in another training order ({'; '.join(differs)}): the samples already trained "
                              f"on cannot be found in this one. Resume with the checkpoint's data, or {_AT_AN_EPOCH_END}")


def _refuse_other_shape(where: str, saved_ranks: int, ranks: int, saved_batch: int | None, batch: int | None) -> None:
    why = ("its position is not kept in samples of fw's global order, so it cannot be mapped exactly (samples "
           "would be trained twice or skipped)")
    if saved_ranks != ranks:
        raise CheckpointError(
            f"{where} on {_ranks(saved_ranks)}, and this run has {ranks}: {why}. Resume on "
            f"{_ranks(saved_ranks)} (trainer.devices * trainer.num_nodes = {saved_ranks}), or {_AT_AN_EPOCH_END}"
        )
    raise CheckpointError(
        f"{where} with {saved_batch} samples per batch per rank, and this run's training batch size is {batch}: "
        f"{why}. Resume with batch size {saved_batch}, or {_AT_AN_EPOCH_END}"
    )
