"""One batch of a no-grad stage (validation, test, predict) as Lightning calls it: the
batch-start hook, the step under the precision's forward context with ``(batch, batch_idx)`` and,
with several loaders, ``dataloader_idx`` (cut to the arguments the step takes), then the
batch-end hook with the step's output. ``evaluation.py`` and ``predict.py`` both run it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from framework.trainer.run import Run


def batch_call(run: Run, step_fn: Callable[..., Any], arity: int, batch_start: Callable[..., Any] | None,
               batch_end: Callable[..., Any] | None, n_loaders: int) -> Callable[[Any, int, int], Any]:
    """``(batch, batch_idx, dataloader_idx) -> outputs`` for ``step_fn`` (which takes ``arity``
    positional arguments) between the per-batch hooks (None: nobody overrides it)."""

    def call(batch: Any, batch_idx: int, dl_idx: int) -> Any:
        where = (batch_idx,) if n_loaders == 1 else (batch_idx, dl_idx)  # Lightning's arguments
        if batch_start is not None:
            batch_start(batch, *where)
        with run.precision.forward_context():
            outputs = step_fn(*(batch, *where)[:arity])
        if batch_end is not None:
            batch_end(outputs, batch, *where)
        return outputs

    return call
