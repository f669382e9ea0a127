"""A small explicit registry of strategies: register by name, refuse duplicates, and list the
known names when asked for an unknown one."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from framework.errors import ConfigError, did_you_mean
from framework.strategies.base import Strategy

#: Lightning's strategies fw does not provide, and what to use instead
_NOT_PROVIDED = {
    "deepspeed": "use strategy=fsdp, which shards parameters, gradients and optimizer state over the ranks as "
                 "DeepSpeed's ZeRO stage 3 does (sharding_strategy=SHARD_GRAD_OP for stage 2)",
    "fsdp_cpu": "Lightning's fsdp_cpu_offload is strategy=fsdp with cpu_offload=True "
                "(in a recipe: trainer.strategy={name: fsdp, cpu_offload: true})",
    "xla": "fw runs on CPU and CUDA devices only (accelerator=cpu or cuda)",
    "hpu_parallel": "fw runs on CPU and CUDA devices only (accelerator=cpu or cuda)",
    "hpu_single": "fw runs on CPU and CUDA devices only (accelerator=cpu or cuda)",
    # Lightning 1.x's names for what is now a strategy
    "ddp_cpu": "Lightning 1.x's ddp_cpu is trainer.strategy=ddp_gloo (DDP over Gloo: one process per CPU device, "
               "trainer.accelerator=cpu trainer.devices=N)",
    "ddp2": "Lightning 1.x's ddp2 is gone (as in Lightning 2): use trainer.strategy=ddp",
}
#: strategies that need a GPU: not suggested for a run on the CPU
_GPU_ONLY = ("ddp_nccl", "dp")


class StrategyRegistry:
    """Strategies by name: ``register`` refuses a name twice; ``create`` refuses an unknown name (listing the
    known ones, with a suggestion) and an option that the strategy does not take."""

    def __init__(self) -> None:
        self._factories: dict[str, Callable[..., Strategy]] = {}
        self._help: dict[str, str] = {}
        self.other_names: list[str] = []  # names resolved before the registry (auto, ddp, aliases)

    def register(self, name: str, factory: Callable[..., Strategy], description: str = "") -> None:
        """Add ``name``: ``factory(**options)`` builds the strategy; ``description`` is its line in ``describe()``."""
        if name in self._factories:
            raise ValueError(f"strategy '{name}' is already registered")
        self._factories[name] = factory
        self._help[name] = description

    def names(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self._factories)

    def describe(self) -> dict[str, str]:
        """Each registered name with its one-line description."""
        return dict(self._help)

    def create(self, name: str, accelerator_name: str = "cpu", **options: Any) -> Strategy:
        """The strategy ``name`` with its ``options``; an unknown name is refused with the known
        ones, and a suggestion among those that run on ``accelerator_name``."""
        instead = _NOT_PROVIDED.get(name.split("_stage")[0].removesuffix("_offload"))
        if name not in self._factories and instead:
            raise ConfigError(f"trainer.strategy: fw has no '{name}' strategy; {instead}")
        if name not in self._factories:
            known = sorted([*self._factories, *self.other_names])
            runnable = [k for k in known if accelerator_name == "cuda" or k not in _GPU_ONLY]
            raise ConfigError(
                f"trainer.strategy: unknown strategy '{name}'{did_you_mean(name, runnable)}; known: {', '.join(known)}"
            )
        factory = self._factories[name]
        accepted = self._options(factory)
        unknown = [key for key in options if accepted is not None and key not in accepted]
        if unknown:
            takes = f"it takes {', '.join(sorted(accepted))}" if accepted else "it takes no options"
            raise ConfigError(
                f"trainer.strategy: '{name}' has no option '{unknown[0]}'"
                f"{did_you_mean(unknown[0], accepted or [])}; {takes}"
            )
        return factory(**options)

    @staticmethod
    @functools.cache  # a signature is read once per factory, not at every Trainer
    def _options(factory: Callable[..., Strategy]) -> set[str] | None:
        """The keyword options a factory takes (None when it forwards **kwargs we cannot see)."""
        params = inspect.signature(factory).parameters  # a class's: its __init__'s, without self
        names = {n for n, p in params.items() if n != "self" and p.kind is not p.VAR_KEYWORD}
        if any(p.kind is p.VAR_KEYWORD for p in params.values()):
            return None
        return names
