"""The Trainer and what it owns for a run.

- ``trainer.py``: ``Trainer`` — its arguments (the one list of them), its public API
  (fit/validate/test/predict/save_checkpoint) and where each call runs.
- ``settings.py``: ``Settings`` — the arguments checked and resolved once (``arguments.py``
  checks each), frozen.
- ``run.py``: ``Run`` — one call's parts, what the loops take; ``properties.py``,
  ``data_properties.py``, ``fit_loop_view.py``: the Trainer's Lightning names, read from its
  settings, its state and the current ``Run``.
- ``controls.py``: what code outside this package may change on a Trainer, each a named method.
- ``state.py``: ``RunState`` — where the run stands (epoch, step counters, stop reason).
- ``resume.py``: the data position and how to get back to it (checkpoint parts, the resumed
  epoch's iterator), and the checkpoints a fit refuses to continue.
- ``preemption.py``: stop signals end to end (handlers, the joint stop check, the checkpoint).
- ``parts.py``: the stateful parts a checkpoint is made of; ``checkpointing.py``: which parts a
  run's checkpoint holds, save and restore (the strategy reads and writes the file).
- ``setup.py``: what a call builds before its loop and releases after it; ``spawned_outcome.py``: what
  a call run in spawned workers brings back.
- ``metrics.py``: what ``self.log`` records and how it becomes step and epoch values.
"""

from framework.trainer.trainer import Trainer

__all__ = ["Trainer"]
