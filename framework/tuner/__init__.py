"""Tuning before training, Lightning's ``Tuner``: ``Tuner(trainer).lr_find(model)`` and
``Tuner(trainer).scale_batch_size(model)``.

- ``tuning.py``: ``Tuner``, its arguments and checks.
- ``trials.py``: how the Tuner runs its trials (the Trainer's own calls) on the user's Trainer
  and puts everything back after them.
- ``lr_sweep.py``: the learning-rate sweep; ``lr_finder.py``: its results (``LRFinder``:
  ``results``, ``suggestion()``, ``plot()``).
- ``batch_size.py``: the batch-size search (``power``, ``binsearch``) and out-of-memory trials.
- ``attributes.py``: where the tuned value lives (module, ``hparams``, DataModule).
"""

from framework.tuner.lr_finder import LRFinder
from framework.tuner.tuning import Tuner

__all__ = ["LRFinder", "Tuner"]
