"""When a sharded model holds gathered parameters, and how fw makes it give them back.

FSDP2 gathers a unit's parameters in its forward. A unit other than the root reshards them after
its forward (``FULL_SHARD``); the root keeps them for the backward that follows at once (torch's
default for a root, as FSDP1's under Lightning), and its backward reshards them. A step that no
backward follows (evaluation, predict, a training step under ``no_grad`` or without a loss) would
leave the root gathered: its parameters would then be whole tensors rather than shards, which
``get_state_dict`` cannot save (``KeyError: 0``) and a checkpoint could not be loaded into. So
such a step reshards at once (``resharding``), and every checkpoint save or load reshards first
(``reshard_all``): between steps a sharded model holds only shards.

Manual optimization (``ManualSteps``) runs its backwards inside the root's forward, before it
ends: the root's gradients are reduce-scattered by each backward (the root's pre-backward hook is
put on the loss, as its forward's end would put it on its outputs), and the root gathers its
parameters again after each backward and each optimizer step, so that a forward after either (a
second loss, a GAN's other network) computes with full parameters of the current values; the
step's end reshards (no backward follows it).
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


class ManualSteps:
    """What manual optimization under ``fsdp`` does around its steps, its backwards and its
    optimizer steps (the module docstring)."""

    def __init__(self, root: nn.Module) -> None:
        self.root = root
        self.gathered = False  # the root gathered its parameters again inside the step

    def step(self, step: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            try:
                return step(*args, **kwargs)
            finally:
                self.gathered = False
                reshard_all(self.root)

        return run

    def backward(self, backward: Callable[..., None]) -> Callable[..., None]:
        from torch.distributed.fsdp import fully_shard

        def run(loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
            loss = fully_shard.state(self.root)._register_pre_backward_hook(loss)  # type: ignore[attr-defined]
            backward(loss, *args, **kwargs)
            self.root.unshard()  # type: ignore[operator]
            self.gathered = True

        return run

    def after_optimizer_step(self) -> None:
        if self.gathered:  # the gathered copies hold the values from before the step
            self.root.reshard()  # type: ignore[operator]
            self.root.unshard()  # type: ignore[operator]

