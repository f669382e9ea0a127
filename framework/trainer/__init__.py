"""The Trainer and what it owns for a run.

- ``trainer.py``: ``Trainer`` — its arguments (the one list of them), its public API
  (fit/validate/test/predict/save_checkpoint) and the run's orchestration.
- ``arguments.py``: checking and normalising those arguments.
- ``state.py``: ``RunState`` — where the run stands (epoch, step, position, stop reason,
  resume point), as one value that checkpoints save and restore.
- ``setup.py``: what a run builds before its loop (process group, data, loggers, model,
  optimisers) and releases after it.
- ``checkpointing.py``: checkpoint contents, save and restore.
- ``resume.py``: where a resumed fit continues, and the checkpoints it refuses to continue.
- ``hooks.py``: ``HookDispatcher``, the one way hooks are called, and the ordering rules.
- ``metrics.py``: what ``self.log`` records and how it becomes step and epoch values.
"""

from framework.trainer.trainer import Trainer

__all__ = ["Trainer"]
