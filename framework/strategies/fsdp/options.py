"""How ``fsdp``'s arguments (Lightning's names) become FSDP2's: the units to shard
(``auto_wrap_policy``), the hybrid mesh (``device_mesh``) and the mixed-precision policy
(``trainer.precision``). Each refuses what fw does not run, naming the key and the fix."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from framework.errors import ConfigError, raised_alike_on_every_rank
from framework.rank_zero import rank_zero_info


def mesh_shape(device_mesh: Any, sharding_strategy: str) -> tuple[int, int] | None:
    """The hybrid mesh asked for (``(0, 0)``: the default, found at set-up), or None (one dimension)."""
    if sharding_strategy != "HYBRID_SHARD":
        if device_mesh is not None:
            raise ConfigError(f"trainer.strategy.device_mesh is for sharding_strategy HYBRID_SHARD, not "
                              f"{sharding_strategy}; drop it, or set sharding_strategy: HYBRID_SHARD")
        return None
    if device_mesh is None:
        return (0, 0)
    shape = tuple(device_mesh)
    if len(shape) != 2 or not all(isinstance(n, int) and n > 0 for n in shape):
        raise ConfigError(f"trainer.strategy.device_mesh={list(shape)}: give [replicas, shard size], two positive "
                          "whole numbers whose product is the world size (e.g. [2, 4] for 8 ranks)")
    return shape[0], shape[1]


@raised_alike_on_every_rank()  # the recipe alone
def precision_policy(precision: str) -> Any:
    """The mixed-precision policy for ``trainer.precision``: ``bf16-mixed`` gathers and computes
    in bfloat16 and reduces gradients in float32 into float32 shards (the master weights)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if precision.endswith("-true"):  # the weights are already in that dtype (Precision.convert_module)
        return MixedPrecisionPolicy()
    if precision == "bf16-mixed":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    raise ConfigError(f"trainer.precision={precision} with strategy fsdp: not supported (16-mixed needs a sharded "
                      "gradient scaler); use trainer.precision=bf16-mixed, bf16-true or 32-true")


def without_split_ties(module: nn.Module, blocks: list[nn.Module]) -> list[nn.Module]:
    """``blocks`` less those that share a parameter with a module outside them (a GPT's embedding,
    whose weight its head uses): FSDP cannot split one parameter over two units, so it stays in
    the unit around both (the root, or a larger block), as one unit holding both modules would."""
    names = {id(m): name for name, m in module.named_modules()}
    owners: dict[int, list[str]] = {}
    for name, sub in module.named_modules(remove_duplicate=False):
        for param in sub._parameters.values():
            if param is not None:
                owners.setdefault(id(param), []).append(name)
    kept = []
    for block in blocks:
        inside = names[id(block)]
        outside = [other for mine in block.parameters() for other in owners[id(mine)]
                   if other != inside and not other.startswith(f"{inside}.")]
        if not outside:
            kept.append(block)
        else:
            rank_zero_info(f"fw: {type(block).__name__} '{inside}' shares a parameter with '{outside[0]}', outside it: "
                           "it is sharded with the unit around both, not as a unit of its own")
    return kept


def only_sharded(optimizers: list[torch.optim.Optimizer]) -> None:
    """Refuse an optimizer built before sharding: it would step tensors the model no longer uses."""
    from torch.distributed.tensor import DTensor

    for i, optimizer in enumerate(optimizers):
        plain = [p for group in optimizer.param_groups for p in group["params"] if not isinstance(p, DTensor)]
        if plain:
            raise ConfigError(
                f"optimizer {i} ({type(optimizer).__name__}) holds {len(plain)} parameter(s) that FSDP did not "
                "shard (built before sharding, e.g. in __init__): it would step tensors the model no longer "
                "uses. Build it in configure_optimizers() from self.parameters()")
