"""The ``TrainModule`` (Lightning's ``LightningModule``): the user's model with its steps and hooks,
and the optimizers ``self.optimizers()`` gives it (``TrainOptimizer``, Lightning's ``LightningOptimizer``).

train_module.py is the class; hooks.py the hooks the Trainer calls and their defaults; hparams.py
``save_hyperparameters`` and ``load_from_checkpoint`` (a ``DataModule``'s too); export.py ``to_onnx``
and ``to_torchscript``; attributes.py ``device`` and Lightning's other plain attributes;
manual_optimization.py ``TrainOptimizer`` and what a run does for a module that steps its optimizers
itself; step_arity.py whether a step is called with ``batch_idx``.
"""

from framework.module.manual_optimization import LightningOptimizer, TrainOptimizer
from framework.module.train_module import LightningModule, TrainModule

__all__ = ["LightningModule", "LightningOptimizer", "TrainModule", "TrainOptimizer"]
