"""Recipes: schema, loading with overrides, and ``_target_`` instantiation."""

from framework.config.instantiate import instantiate, locate
from framework.config.recipe import load_recipe
from framework.config.schema import RecipeConfig, TrainerConfig

__all__ = ["RecipeConfig", "TrainerConfig", "instantiate", "load_recipe", "locate"]
