"""Activation checkpointing (``Trainer(activation_checkpointing_policy={Block})``, Lightning's
name; also an option of the ``fsdp`` and ``model_parallel`` strategies, as of Lightning's FSDP): each
submodule of a named class keeps only its inputs for the backward and computes its activations
again there, trading one more forward of it for the memory of everything it made.

It is ``torch.distributed._composable.checkpoint`` (non-reentrant ``torch.utils.checkpoint`` through
forward hooks): the module and its parameters keep their names, so ``state_dict()`` and every
checkpoint are those of the run without it, and the RNG state is replayed for the second forward
(dropout draws the same mask), so the run trains the same numbers bit for bit. It is applied after
``configure_model`` and before the strategy wraps or shards the model, once per module (later calls
on the same module find it applied).
"""

from __future__ import annotations

from typing import Any

from torch import nn

#: set on a submodule that checkpoints its activations
_APPLIED = "_fw_activation_checkpointed"
KEY = "trainer.activation_checkpointing_policy"


def policy_names(policy: Any, key: str = KEY) -> frozenset[str]:
    """The class names a policy (classes, or their names in a recipe) stands for."""
    from framework.strategies.fsdp.options import class_names

    return frozenset(class_names(policy, key))


def checkpoint_activations(module: nn.Module, names: frozenset[str], key: str = KEY) -> int:
    """Checkpoint the activations of every submodule of ``module`` whose class is in ``names``;
    how many there are (a named class the model lacks is refused, naming the classes it has)."""
    from torch.distributed._composable import checkpoint

    from framework.strategies.fsdp.options import units

    if not names:
        return 0
    blocks = units(module, set(names), key)
    for block in blocks:
        if not block.__dict__.get(_APPLIED):
            checkpoint(block)
            block.__dict__[_APPLIED] = True
    return len(blocks)


def recomputing(module: nn.Module) -> bool:
    """Is ``module`` running its forward again for the backward? Its own hooks run again then, on
    the inputs the first run's hooks gave it (a split of them must not split them again)."""
    if not module.__dict__.get(_APPLIED):
        return False
    from torch.distributed._composable import checkpoint

    return not checkpoint.state(module).enable_hook  # turned off while it recomputes


def one_policy(trainer_policy: frozenset[str], strategy_policy: Any) -> tuple[frozenset[str], str]:
    """The run's policy and the key it came from: the Trainer's or the strategy's (both given
    and different: refused)."""
    from framework.errors import ConfigError

    strategy_names = policy_names(strategy_policy, "trainer.strategy.activation_checkpointing_policy")
    if trainer_policy and strategy_names and trainer_policy != strategy_names:
        raise ConfigError(f"{KEY}={sorted(trainer_policy)} and trainer.strategy.activation_checkpointing_policy="
                          f"{sorted(strategy_names)}: give it once (either is Lightning's place for it)")
    if strategy_names:
        return strategy_names, "trainer.strategy.activation_checkpointing_policy"
    return trainer_policy, KEY
