"""Build a run from a checked recipe and execute one stage (what ``fw fit`` does)."""

from __future__ import annotations

from pathlib import Path, PurePath, PurePosixPath
from typing import TYPE_CHECKING, Any

from framework.callbacks.base import Callback
from framework.config import instantiate
from framework.paths import is_url, join, new_record, write_text
from framework.rank_zero import rank_zero_info, rank_zero_print, rank_zero_warn

if TYPE_CHECKING:
    from framework.module import TrainModule
    from framework.trainer import Trainer


class SaveRecipe(Callback):
    """Writes the merged recipe into the run directory (rank 0), so that a run can be read back
    and repeated: ``config.yaml`` for a fit, ``<stage>-config.yaml`` for ``fw validate``, ``test``
    and ``predict`` (each in a version folder of its own, which the loggers pick for an
    evaluation). It is written when the stage starts, once set-up has passed its checks (the
    checkpoint loaded), so a refused run leaves no record; and never over an earlier command's:
    where the name is taken (a resumed fit goes on in its checkpoint's folder, a pinned
    ``logger.version``, ``logger=false`` runs sharing ``default_root_dir``) the record is
    ``config-1.yaml``, ``config-2.yaml``, ... and the run says so."""

    def __init__(self, text: str, stage: str) -> None:
        self.text, self.stage = text, stage
        self.written: PurePath | None = None

    def on_fit_start(self, trainer: Trainer, module: TrainModule) -> None:
        self._write(trainer, "fit")

    def on_validation_start(self, trainer: Trainer, module: TrainModule) -> None:
        self._write(trainer, "validate")  # also called inside a fit, whose record is written already

    def on_test_start(self, trainer: Trainer, module: TrainModule) -> None:
        self._write(trainer, "test")

    def on_predict_start(self, trainer: Trainer, module: TrainModule) -> None:
        self._write(trainer, "predict")

    def _write(self, trainer: Trainer, stage: str) -> None:
        if stage != self.stage or self.written is not None or not trainer.is_global_zero:
            return
        where = trainer.log_dir or trainer.default_root_dir  # a folder or a URL (paths.py)
        stem = "config" if stage == "fit" else f"{stage}-config"
        record = new_record(where, stem)
        write_text(record, self.text)
        self.written = path = Path(record) if not is_url(record) else PurePosixPath(record)
        if path.name != f"{stem}.yaml":
            rank_zero_info(f"fw {stage}: {join(where, stem + '.yaml')} is an earlier command's record and stays as "
                           f"it is; this run's recipe is {path.name}")


def run_recipe(stage: str, recipe: dict, recipe_text: str) -> Any:
    from framework.callbacks import PredictionWriter
    from framework.seed import seed_everything
    from framework.trainer import Trainer

    if recipe.get("seed") is not None:
        seed_everything(recipe["seed"])
    # the Trainer first: a wrong strategy or device fails before a model or data set is built
    callbacks = instantiate(list(recipe.get("callbacks") or []), "callbacks")
    if stage == "predict" and not any(isinstance(cb, PredictionWriter) for cb in callbacks):
        callbacks.append(PredictionWriter())  # predictions.pt in the run directory; it says where
    logger = recipe.get("logger", True)
    logger = instantiate(logger, "logger") if isinstance(logger, (dict, list)) else logger
    arguments = dict(recipe["trainer"])
    if isinstance(arguments.get("profiler"), dict):  # {_target_: framework.profilers.SimpleProfiler, ...}
        arguments["profiler"] = instantiate(arguments["profiler"], "trainer.profiler")
    trainer = Trainer(**arguments, callbacks=[*callbacks, SaveRecipe(recipe_text, stage)], logger=logger)
    module = instantiate(recipe["module"], "module")
    data = instantiate(recipe["data"], "data") if recipe.get("data") else None
    ckpt_path = recipe.get("ckpt_path")
    if isinstance(ckpt_path, str) and ckpt_path.lower() == "none":  # fresh weights on purpose: say nothing
        ckpt_path = None
    elif ckpt_path is None and stage != "fit":
        rank_zero_warn(f"fw {stage} without ckpt_path scores freshly initialised weights; give "
                       "ckpt_path=last (this run's newest) or ckpt_path=PATH, or ckpt_path=none if that is intended")
    if stage == "fit":
        trainer.fit(module, datamodule=data, ckpt_path=ckpt_path)
        result = None
    else:
        result = getattr(trainer, stage)(module, datamodule=data, ckpt_path=ckpt_path)
    if stage == "predict":  # text a module generated is what the command was asked for: it goes to stdout
        for text in _texts(result):
            rank_zero_print(text)
    else:
        values = trainer.callback_metrics
        metrics = {k: float(v) for k, v in sorted(values.items()) if v.numel() == 1 and not _shadowed(k, values)}
        if metrics:
            rank_zero_print("fw: final metrics: " + ", ".join(f"{k}={_shown(v)}" for k, v in metrics.items()))
    return result


def _shown(value: float) -> str:
    """A final metric to 4 decimals, or to 3 significant digits when that would hide it (a
    learning rate of 2e-05 is not 0.0000)."""
    return f"{value:.4f}" if value == 0 or not abs(value) < 0.001 else f"{value:.3g}"


def _texts(predictions: Any) -> list[str]:
    """The strings among the predictions (one list per loader when there are several)."""
    if isinstance(predictions, str):
        return [predictions]
    if isinstance(predictions, (list, tuple)):
        return [text for item in predictions for text in _texts(item)]
    return []


def _shadowed(name: str, values: dict) -> bool:
    """A metric logged on step and epoch appears as ``x``, ``x_step`` and ``x_epoch``: the final
    line shows ``x_epoch`` alone."""
    base = name[: -len("_step")] if name.endswith("_step") else name
    return f"{base}_epoch" in values and name != f"{base}_epoch"

