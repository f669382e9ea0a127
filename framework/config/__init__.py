"""Recipes: schema, loading with overrides, and ``_target_`` instantiation."""

from typing import Any

from framework.config.instantiate import instantiate, locate
from framework.config.recipe import load_recipe


def __getattr__(name: str) -> Any:
    """``RecipeConfig`` and ``TrainerConfig``, built on first use (they read the Trainer's
    signature: importing the recipe code does not load the Trainer)."""
    if name in ("RecipeConfig", "TrainerConfig"):
        from framework.config import schema

        return getattr(schema, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["RecipeConfig", "TrainerConfig", "instantiate", "load_recipe", "locate"]
