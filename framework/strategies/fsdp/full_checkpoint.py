"""FSDP's full-state checkpoints (``state_dict_type="full"``): the one file fw writes for DDP,
with the model and optimizer state gathered from the shards.

Saving: every rank takes part in ``get_model_state_dict``/``get_optimizer_state_dict`` with
``full_state_dict=True, cpu_offload=True`` (a collective: only rank 0 keeps the result, in CPU
memory), then rank 0 writes as for DDP (``checkpointing/single_file.py``: ``save_from_rank_zero``). The optimizer
state is keyed by parameter name (``fw_optimizer_keys: names`` in the file). Loading: every rank
reads the file and ``set_*_state_dict`` shards its full state onto this rank's parameters. A
checkpoint of DDP or one process (optimizer state keyed by position) is renamed first, and one
of FSDP resumes under DDP or in one process (``optimizer_keys.py``), on any number of ranks.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from framework.checkpointing import file as ckpt
from framework.checkpointing.optimizer_keys import keyed_by_name, to_names
from framework.checkpointing.parts import Value, check_count, items_of
from framework.checkpointing.single_file import load_on_every_rank, save_from_rank_zero
from framework.errors import CheckpointError

if TYPE_CHECKING:
    from framework.checkpointing.parts import CheckpointParts
    from framework.module import TrainModule
    from framework.strategies.base import Strategy


def save_full(strategy: Strategy, module: TrainModule, path: str, parts: CheckpointParts) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    shared = dict(parts.shared)
    weights = get_model_state_dict(module, options=full)
    shared["state_dict"] = Value.saved_only(lambda: weights)
    if "optimizer_states" in shared:
        states = [get_optimizer_state_dict(module, opt, options=full) for opt in items_of(shared["optimizer_states"])]
        shared["optimizer_states"] = Value.saved_only(lambda: states)
    values = {**parts.values, "fw_optimizer_keys": "names"}
    save_from_rank_zero(strategy, path, replace(parts, shared=shared, values=values))


def load_full(strategy: Strategy, module: TrainModule, path: str, parts: CheckpointParts) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    full = StateDictOptions(full_state_dict=True)

    def put_weights(weights: dict) -> None:
        try:
            set_model_state_dict(module, weights, options=full)
        except (RuntimeError, KeyError, ValueError) as err:
            raise CheckpointError(f"checkpoint '{path}' does not fit this model: {ckpt.state_dict_mismatch(err)}") from None

    shared = dict(parts.shared)
    shared["state_dict"] = Value.loaded_only(put_weights)
    if "optimizer_states" in shared:
        optimizers = items_of(shared["optimizer_states"])

        def put_optimizers(states: list) -> None:
            check_count(states, optimizers, "optimizer", path)
            for opt, state in zip(optimizers, states, strict=True):
                if not keyed_by_name(state):  # a DDP or one-process checkpoint
                    state = to_names(state, opt, module, path)
                if state.get("state"):
                    set_optimizer_state_dict(module, opt, state, options=full)
                else:  # a stateless optimizer (SGD without momentum): torch's loader cannot place it
                    _load_param_groups(opt, state.get("param_groups", []), path)

        shared["optimizer_states"] = Value.loaded_only(put_optimizers)
    return load_on_every_rank(strategy, path, replace(parts, shared=shared))


def _load_param_groups(optimizer: Any, groups: list[dict], path: str) -> None:
    """The hyperparameters of each group (a scheduler's learning rate, say); its parameters stay."""
    if len(groups) != len(optimizer.param_groups):
        raise CheckpointError(f"checkpoint '{path}' holds {len(groups)} parameter group(s) for {type(optimizer).__name__} "
                              f"and configure_optimizers() made {len(optimizer.param_groups)}: resume with the "
                              "configure_optimizers() it was written with")
    for mine, saved in zip(optimizer.param_groups, groups, strict=True):
        mine.update({key: value for key, value in saved.items() if key != "params"})
