"""When a sharded model holds gathered parameters, and how fw makes it give them back.

FSDP2 gathers a unit's parameters in its forward. A unit other than the root reshards them after
its forward (``FULL_SHARD``); the root keeps them for the backward that follows at once (torch's
default for a root, as FSDP1's under Lightning), and its backward reshards them. A step that no
backward follows (evaluation, predict, a training step under ``no_grad`` or without a loss) would
leave the root gathered: its parameters would then be whole tensors rather than shards, which
``get_state_dict`` cannot save (``KeyError: 0``) and a checkpoint could not be loaded into. So
such a step reshards at once (``resharding``), and every checkpoint save or load reshards first
(``reshard_all``): between steps a sharded model holds only shards.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves


def fsdp_modules(model: nn.Module) -> list[nn.Module]:
    """The modules of ``model`` that ``fully_shard`` made units (the root among them)."""
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def reshard_all(model: nn.Module) -> None:
    """Every unit gives back what it gathered (a no-op for a unit that holds only its shards)."""
    for unit in fsdp_modules(model):
        unit.reshard()  # type: ignore[operator]


def resharding(step: Callable[..., Any], units: list[nn.Module]) -> Callable[..., Any]:
    """``step``, after which ``units`` reshard when no backward will follow: nothing in its
    outputs needs a gradient."""
    if not units:
        return step

    def run(*args: Any, **kwargs: Any) -> Any:
        out = step(*args, **kwargs)
        if not any(t.requires_grad for t in tree_leaves(out) if isinstance(t, torch.Tensor)):
            for unit in units:
                unit.reshard()  # type: ignore[operator]
        return out

    return run
