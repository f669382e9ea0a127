"""``LRFinder``: what ``Tuner.lr_find`` found, Lightning's ``_LRFinder``: the learning rates it
tried and the smoothed loss after each (``results``), the rate it suggests and a plot of both."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from framework.errors import ConfigError, install_command
from framework.rank_zero import rank_zero_warn

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure, SubFigure

#: how ``lr_find`` raises the learning rate after each step
MODES = ("linear", "exponential")


class LRFinder:
    """The results of one learning-rate sweep.

    Attributes:
        mode: ``exponential`` or ``linear``: how the rate grew from ``lr_min`` to ``lr_max``.
        lr_min, lr_max, num_training: the sweep asked for (it may have stopped before its end).
        results: ``{"lr": [...], "loss": [...]}``, one entry per optimizer step: the rate the
            step used and the loss smoothed over the steps so far (NaN for a step whose
            ``training_step`` returned None), as Lightning records them.
    """

    def __init__(self, mode: str, lr_min: float, lr_max: float, num_training: int) -> None:
        assert mode in MODES, mode
        self.mode, self.lr_min, self.lr_max, self.num_training = mode, lr_min, lr_max, num_training
        self.results: dict[str, Any] = {}
        self._optimal_idx: int | None = None

    def suggestion(self, skip_begin: int = 10, skip_end: int = 1) -> float | None:
        """The rate where the loss falls fastest: the steepest negative slope of the loss over
        the rate, leaving out the first ``skip_begin`` and the last ``skip_end`` points (too naive
        and too optimistic estimates) and the non-finite ones.

        Returns:
            That rate, or None when fewer than two points are left (a warning says so).
        """
        lrs_all, losses_all = self.results["lr"], self.results["loss"]
        kept = range(len(losses_all))[skip_begin:len(losses_all) - skip_end]
        # float32 tensors and torch.gradient, as Lightning computes it: the same points give the same rate
        losses = torch.tensor([losses_all[i] for i in kept])
        lrs = torch.tensor([lrs_all[i] for i in kept])
        finite = torch.isfinite(losses)
        losses, lrs = losses[finite], lrs[finite]
        if len(losses) < 2:
            rank_zero_warn(f"lr_find: no learning rate to suggest: {len(losses)} finite point(s) after skipping "
                           f"{skip_begin} at the start and {skip_end} at the end, of {len(losses_all)}; raise "
                           "num_training (or the training batches: max_epochs, limit_train_batches)")
            self._optimal_idx = None
            return None
        slopes = torch.gradient(losses, spacing=[lrs])[0]
        finite_idx = [i for i, ok in zip(kept, finite.tolist(), strict=True) if ok]
        self._optimal_idx = finite_idx[int(torch.argmin(slopes).item())]
        return lrs_all[self._optimal_idx]

    def plot(self, suggest: bool = False, show: bool = False, ax: Axes | None = None) -> Figure | SubFigure | None:
        """The loss over the learning rate (a log scale for an exponential sweep), with the
        suggested rate as a red point when ``suggest``; ``show`` calls ``plt.show()``. Draws on
        ``ax`` when given, else on a new figure; returns the figure. Needs matplotlib."""
        try:
            import matplotlib.pyplot as plt
        except ImportError as err:
            raise ConfigError(f"LRFinder.plot needs matplotlib: {install_command('bench')} "
                              "(or pip install matplotlib)") from err
        lrs, losses = self.results["lr"], self.results["loss"]
        fig: Figure | SubFigure
        if ax is None:
            fig, ax = plt.subplots()
        else:
            fig = ax.figure
        ax.plot(lrs, losses)
        if self.mode == "exponential":
            ax.set_xscale("log")
        ax.set_xlabel("Learning rate")
        ax.set_ylabel("Loss")
        if suggest and self.suggestion() is not None and self._optimal_idx is not None:
            ax.plot(lrs[self._optimal_idx], losses[self._optimal_idx], markersize=10, marker="o", color="red")
        if show:
            plt.show()
        return fig
