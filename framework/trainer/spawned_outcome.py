"""``Outcome``: what a call run in other processes (``ddp_spawn``, ``ddp_notebook``) brings back.

The launcher runs ``Trainer._run_in_worker`` as every rank and hands back rank 0's ``Outcome``,
one picklable value; the Trainer applies it to itself (``apply``), as Lightning does: the
trained weights go into the caller's module, and ``callback_metrics``, ``global_step``,
``current_epoch``, why the fit stopped, the checkpoint callbacks' best/last paths and the run
directory are the workers', and so are the loggers' folder and version (one Trainer keeps one
log version across its calls, as in one process). The call's return value comes back with them,
and after a fit what a ``trainer.save_checkpoint()`` here writes of it (``end_of_fit.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from framework.trainer import checkpointing, end_of_fit
from framework.trainer.run import Run

if TYPE_CHECKING:
    from framework.checkpointing.parts import EndOfFit
    from framework.loggers.base import HparamsFile
    from framework.module import TrainModule
    from framework.trainer.trainer import Trainer


def _cpu(value: Any) -> Any:
    return value.detach().cpu() if isinstance(value, torch.Tensor) else value


@dataclass(frozen=True)
class Outcome:
    fn: str
    state_dict: dict[str, torch.Tensor]
    callback_metrics: dict[str, Any]
    progress_bar: set[str]
    logged: set[str]
    epoch: int
    global_step: int
    stop_reason: str | None
    status: str
    checkpoints: list[tuple[str, Any, str]]
    log_dir: str | None
    loggers: list[tuple[str, int | str, HparamsFile]]
    output: Any
    end_of_fit: EndOfFit | None = None

    @classmethod
    def of(cls, trainer: Trainer, output: Any) -> Outcome:
        """This rank's outcome, on the CPU (so that a CUDA worker's comes back to any process)."""
        module, run = trainer.lightning_module, trainer.run
        assert run is not None and module is not None
        state = trainer.state
        kept = end_of_fit.brought_back(run, checkpointing.parts_of(run, for_fit=True)) if run.fn == "fit" else None
        return cls(
            fn=run.fn,
            state_dict={k: v.detach().cpu() for k, v in module.state_dict().items()},
            callback_metrics={k: _cpu(v) for k, v in trainer.callback_metrics.items()},
            progress_bar=set(trainer.progress_bar_metrics), logged=set(trainer.logged_metrics),
            epoch=state.epoch, global_step=state.global_step, stop_reason=state.stop_reason, status=state.status,
            checkpoints=[(cb.best_model_path, _cpu(cb.best_model_score), cb.last_model_path)
                         for cb in trainer.checkpoint_callbacks],
            log_dir=trainer.log_dir,
            loggers=[(lg.save_dir, lg.version, lg.hparams_file) for lg in trainer.loggers],
            output=output,
            end_of_fit=kept,
        )

    def apply(self, trainer: Trainer, model: TrainModule) -> Any:
        """Make ``trainer`` and ``model`` what rank 0's were at the end of the call; its return value."""
        model.load_state_dict(self.state_dict)
        model.trainer = trainer
        state = trainer.state
        state.epoch, state.global_step = self.epoch, self.global_step
        state.stop_reason, state.status = self.stop_reason, self.status
        state.fn, state.stage = self.fn, None  # the workers' call ended (``fn`` stays, as in Lightning)
        for cb, (best, score, last) in zip(trainer.checkpoint_callbacks, self.checkpoints, strict=True):
            cb.best_model_path, cb.best_model_score, cb.last_model_path = best, score, last
        for lg, (save_dir, version, hparams_file) in zip(trainer.loggers, self.loggers, strict=True):
            lg.set_version(version)  # the next call's workers log into the same version folder
            lg.set_default_root(save_dir)
            lg.hparams_file = hparams_file  # and update the hparams file this Trainer made
        run = Run.of(trainer, self.fn, model, trainer.callbacks)
        run.make_current()
        run.log_dir = self.log_dir
        if self.fn == "fit":
            run.end_of_fit = self.end_of_fit
        run.metrics.take_values(self.callback_metrics, self.progress_bar, self.logged)
        return self.output
