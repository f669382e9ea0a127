"""The Trainer and what it owns for a run.

- ``trainer.py``: ``Trainer`` — its arguments (the one list of them), its public API
  (fit/validate/test/predict/save_checkpoint) and where each call runs.
- ``settings.py``: ``Settings`` — the arguments checked and resolved once (``arguments.py``
  checks each), frozen.
- ``run.py``: ``Run`` — one call's parts, what the loops take; ``properties.py``,
  ``data_properties.py``, ``fit_loop_view.py``: the Trainer's Lightning names, read from its
  settings, its state and the current ``Run``.
- ``controls.py``: what code outside this package may change on a Trainer, each a named method.
- ``resume.py``: how the run gets back to where it stood (the progress and data position as
  checkpoint parts, the point a resumed fit continues from).
- ``preemption.py``: stop signals end to end (handlers, the joint stop check, the checkpoint).
- ``parts.py``: the stateful parts a checkpoint is made of; ``checkpointing.py``: which parts a
  run's checkpoint holds, save and restore (the strategy reads and writes the file).
- ``setup.py``: what a call builds before its loop and releases after it; ``spawned_outcome.py``: what
  a call run in spawned workers brings back.

Where the run stands (``RunState``, the data position) and what ``self.log`` records are the
run's data, below the loops that use them: ``framework/run_state/``.
"""

from framework.trainer.trainer import Trainer

__all__ = ["Trainer"]
