"""A weights-only checkpoint (``trainer.save_checkpoint(path, weights_only=True)``,
``ModelCheckpoint(save_weights_only=True)``), as Lightning writes and refuses it.

It holds the weights, the progress (epoch, step, the loop's counters), the hyperparameters and a
DataModule's state: what ``load_from_checkpoint`` and ``validate``/``test(ckpt_path=...)`` read.
It leaves out what only a resumed fit reads (the optimizers, schedulers, precision, callbacks,
the user's own parts, every rank's position), and the run's identity, so that a restarted or
requeued job never picks it to resume from. Only the module's ``on_save_checkpoint`` runs, as in
Lightning. A fit refuses to resume from it (it would go on with fresh optimizers), as Lightning does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from framework.checkpointing import index as checkpoint_index
from framework.checkpointing.parts import CheckpointParts
from framework.errors import CheckpointError

if TYPE_CHECKING:
    from framework.trainer.run import Run

#: the entry that says a checkpoint is fw's weights-only one
MARK = "fw_weights_only"
#: what a weights-only checkpoint leaves out of a fit's parts (``trainer/checkpointing.py``: ``parts_of``)
RESUME_ONLY = ("optimizer_states", "lr_schedulers", "precision", "callbacks", "fw/callback_hooks")


def weights_only_parts(run: Run, parts: CheckpointParts) -> CheckpointParts:
    """A fit's checkpoint ``parts`` less what only a resumed fit reads."""
    shared = {key: part for key, part in parts.shared.items()
              if key not in RESUME_ONLY and key not in run.trainer.checkpoint_parts}
    values = {key: value for key, value in parts.values.items() if key not in checkpoint_index.KEYS}
    values[MARK] = True
    return CheckpointParts(shared=shared, values=values,
                           on_write=lambda checkpoint: run.hooks.module_hook("on_save_checkpoint", checkpoint))


def refuse_to_resume_from_weights_only(checkpoint: dict, path: str) -> None:
    """Raises CheckpointError: ``checkpoint`` is a weights-only one, fw's or Lightning's (a fit of
    fw's sharded without an optimizer has no ``optimizer_states`` either, and resumes)."""
    lightnings = "pytorch-lightning_version" in checkpoint and "optimizer_states" not in checkpoint
    if checkpoint.get(MARK) or lightnings:
        raise CheckpointError(f"ckpt_path '{path}' holds the weights alone (saved with weights_only=True or "
                              "ModelCheckpoint(save_weights_only=True)): a fit cannot resume from it. Load the "
                              "weights with Model.load_from_checkpoint(path) and fit anew, or resume from a full "
                              "checkpoint")
