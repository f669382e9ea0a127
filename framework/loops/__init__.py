"""The loops: what a Trainer call runs once its set-up is done.

- ``fit.py``: ``run_fit`` — sanity check, then training epochs until a limit or a stop request.
- ``training_epoch.py``: one training epoch — batches, periodic validation, the epoch's end.
- ``training_step.py``: one batch of automatic optimization, read top to bottom — training_step,
  the loss check, zero_grad, backward (gradient accumulation, ``no_sync``, autocast), clipping,
  the optimizer step (unscale, GradScaler), with each Lightning hook where Lightning calls it
  (and the closure ``optimizer_step`` overrides and LBFGS get).
- ``nonfinite.py``: what a non-finite loss does (``trainer.on_nonfinite``).
- ``transfer.py``: a batch's way to the device, through the transfer hooks.
- ``forward_only.py``: an epoch of training_step alone (SWA's BatchNorm epoch).
- ``schedulers.py``: stepping the LR schedulers.
- ``evaluation.py``: validate and test — one pass in eval mode, exact across ranks.
- ``predict.py``: predict.
- ``batches.py``: how many batches a loader gives under a limit, and a look-ahead iterator for
  loaders without a length.

- ``hooks.py``: ``HookDispatcher``, the one way hooks are called, and the ordering rules.

Every loop takes the call's ``Run`` (``framework/trainer/run.py``): it reads and advances
``run.state`` (where the run stands), records into ``run.metrics`` (what was logged) and calls
hooks through ``run.hooks``. The loops do not import the Trainer's package (no import cycle).
"""

from framework.loops.evaluation import run_eval_stage, run_evaluation
from framework.loops.fit import run_fit
from framework.loops.predict import run_predict

__all__ = ["run_eval_stage", "run_evaluation", "run_fit", "run_predict"]
