"""A training epoch that runs ``training_step`` alone (``trainer.state.forward_only``).

No backward, no optimizer or scheduler step, no step counted: the batches go through the model in
training mode, so what a forward pass updates (BatchNorm's running statistics) is all that
changes. StochasticWeightAveraging's BatchNorm epoch is one (Lightning's ``fit_loop._skip_backward``).
The steps run under ``no_grad`` (nothing will read their graph) and the precision's autocast, through
the strategy's wrapper as a training step does (DDP's forward under ``no_grad`` neither prepares
a gradient reduction nor, after the first, broadcasts buffers: each rank keeps its own statistics).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from framework.module.step_arity import positional_arity

if TYPE_CHECKING:
    from framework.trainer.run import Run


def forward_only_step_fn(run: Run) -> Callable[[Any, int, bool], Any]:
    """``(batch, batch_idx, steps_now) -> outputs`` of ``training_step``, without backward or step."""
    module, strategy, precision = run.module, run.strategy, run.precision
    step = run.hooks.strategy_fn("training_step", precision.converting(strategy.training_step_fn(module)))
    with_idx = positional_arity(module.training_step) >= 2
    autocast = precision.forward_context if precision.has_forward_context else contextlib.nullcontext

    def train_batch(batch: Any, batch_idx: int, steps_now: bool) -> Any:
        with torch.no_grad(), autocast():
            return step(batch, batch_idx) if with_idx else step(batch)

    return train_batch
