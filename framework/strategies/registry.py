"""A small explicit registry of strategies: register by name, refuse duplicates, and list the
known names when asked for an unknown one."""

from __future__ import annotations

from typing import Any, Callable

from framework.errors import ConfigError, did_you_mean
from framework.strategies.base import Strategy


class StrategyRegistry:
    def __init__(self) -> None:
        self._factories: dict[str, Callable[..., Strategy]] = {}
        self._help: dict[str, str] = {}

    def register(self, name: str, factory: Callable[..., Strategy], description: str = "") -> None:
        if name in self._factories:
            raise ValueError(f"strategy '{name}' is already registered")
        self._factories[name] = factory
        self._help[name] = description

    def names(self) -> list[str]:
        return sorted(self._factories)

    def describe(self) -> dict[str, str]:
        return dict(self._help)

    def create(self, name: str, **options: Any) -> Strategy:
        if name not in self._factories:
            raise ConfigError(
                f"trainer.strategy: unknown strategy '{name}'{did_you_mean(name, self._factories)}; "
                f"known: {', '.join(self.names())}"
            )
        try:
            return self._factories[name](**options)
        except TypeError as err:
            raise ConfigError(f"trainer.strategy ({name}): {err}") from None
