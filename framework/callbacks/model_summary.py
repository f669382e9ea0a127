"""``ModelSummary``: the model's layers as a table at the start of a fit, down to ``max_depth``, as
Lightning's callback (stderr, rank 0). Given, it replaces the summary ``enable_model_summary``
prints (and prints even where that is off, as in Lightning)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from framework.callbacks.base import Callback
from framework.errors import ConfigError

if TYPE_CHECKING:
    from framework.module import TrainModule
    from framework.trainer import Trainer


class ModelSummary(Callback):
    """``max_depth``: 1 the module's direct children, 2 theirs too, -1 every layer, 0 no summary."""

    def __init__(self, max_depth: int = 1, **summarize_kwargs: Any) -> None:
        if not isinstance(max_depth, int) or max_depth < -1:
            raise ConfigError(f"ModelSummary(max_depth={max_depth!r}) must be an int >= -1 (-1: every layer)")
        if summarize_kwargs:
            raise ConfigError(f"ModelSummary({', '.join(summarize_kwargs)}=...): fw's summary takes max_depth alone")
        self._max_depth = max_depth

    def on_fit_start(self, trainer: Trainer, module: TrainModule) -> None:
        if self._max_depth == 0 or not trainer.is_global_zero:
            return
        from framework.trainer.summary import print_model_summary

        print_model_summary(module, self._max_depth)
