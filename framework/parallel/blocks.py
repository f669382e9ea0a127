"""A model's blocks found by the names of their classes: the units ``fsdp`` shards
(``auto_wrap_policy``), the blocks ``parallelize`` splits, the blocks whose activations are
recomputed (``activation_checkpointing_policy``). A class given by name takes its subclasses too."""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn

from framework.errors import ConfigError


def class_names(policy: Iterable[type[nn.Module] | str] | None, key: str = "trainer.strategy.auto_wrap_policy"
                ) -> set[str]:
    """The names of the unit classes (a class's ``__name__``, or the name a recipe gave)."""
    if policy is None:
        return set()
    if isinstance(policy, (str, type)):
        policy = [policy]
    names = set()
    for item in policy:
        if isinstance(item, type) and issubclass(item, nn.Module):
            names.add(item.__name__)
        elif isinstance(item, str) and item:
            names.add(item.rsplit(".", 1)[-1])
        else:
            raise ConfigError(f"{key}: {item!r} is not a module class or its name; "
                              "give the classes of the blocks to shard, e.g. {Block} or [Block]")
    return names


def units(module: nn.Module, names: set[str], key: str = "trainer.strategy.auto_wrap_policy") -> list[nn.Module]:
    """The submodules to shard as units, innermost first; a named class the model lacks is an error."""
    found = [m for m in module.modules() if m is not module and _class_names(m) & names]
    missing = names - set().union(*(_class_names(m) for m in found))
    if missing:
        have = sorted({type(m).__name__ for m in module.modules() if m is not module})
        raise ConfigError(f"{key}: {type(module).__name__} has no submodule of class "
                          f"{', '.join(sorted(missing))}; its submodules' classes: {', '.join(have) or 'none'}")
    return list(reversed(found))  # modules() lists parents first: shard the children before them


def _class_names(module: nn.Module) -> set[str]:
    """The names of the module's class and of those it derives from (a class named in a policy
    takes its subclasses, as ``isinstance`` does: FSDP's ``FSDPBlock`` for ``Block``, too)."""
    return {cls.__name__ for cls in type(module).__mro__ if issubclass(cls, nn.Module) and cls is not nn.Module}
