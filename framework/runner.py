"""Build a run from a checked recipe and execute one stage (what ``fw fit`` does)."""

from __future__ import annotations

from typing import Any

from framework.config import instantiate


def run_recipe(stage: str, recipe: dict, recipe_text: str) -> Any:
    from framework.rank_zero import rank_zero_print
    from framework.seed import seed_everything
    from framework.trainer import Trainer

    if recipe.get("seed") is not None:
        seed_everything(recipe["seed"])
    # the Trainer first: a wrong strategy or device fails before a model or data set is built
    callbacks = instantiate(list(recipe.get("callbacks") or []), "callbacks")
    logger = recipe.get("logger", True)
    logger = instantiate(logger, "logger") if isinstance(logger, (dict, list)) else logger
    trainer = Trainer(**recipe["trainer"], callbacks=callbacks, logger=logger)
    trainer._recipe_text = recipe_text
    module = instantiate(recipe["module"], "module")
    data = instantiate(recipe["data"], "data") if recipe.get("data") else None
    ckpt_path = recipe.get("ckpt_path")
    if stage == "fit":
        result = trainer.fit(module, datamodule=data, ckpt_path=ckpt_path)
    else:
        result = getattr(trainer, stage)(module, datamodule=data, ckpt_path=ckpt_path)
    if stage != "predict":
        metrics = {k: float(v) for k, v in sorted(trainer.callback_metrics.items()) if v.numel() == 1}
        if metrics:
            rank_zero_print("fw: final metrics: " + ", ".join(f"{k}={v:.4f}" for k, v in metrics.items()))
    return result
