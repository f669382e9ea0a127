"""``TrainModule``: the user's model, its steps, its optimisers and its hooks.

A ``TrainModule`` is an ``nn.Module`` with Lightning's method names. The Trainer attaches itself
(``self.trainer``) before any hook runs; ``self.log`` records a metric in the Trainer's
collector for the current stage.
"""

from __future__ import annotations

import inspect
from typing import Any, Mapping

import torch
from torch import nn

from framework.rank_zero import rank_zero_print


class TrainModule(nn.Module):
    """Subclass and implement ``training_step`` and ``configure_optimizers``.

    Example::

        class Classifier(fw.TrainModule):
            def __init__(self, lr: float = 1e-3):
                super().__init__()
                self.save_hyperparameters()
                self.net = nn.Linear(64, 10)

            def training_step(self, batch, batch_idx):
                x, y = batch
                loss = F.cross_entropy(self.net(x), y)
                self.log("train/loss", loss)
                return loss

            def configure_optimizers(self):
                return torch.optim.Adam(self.parameters(), lr=self.hparams["lr"])
    """

    def __init__(self) -> None:
        super().__init__()
        object.__setattr__(self, "_trainer", None)
        object.__setattr__(self, "hparams", {})

    # -- where the module stands ------------------------------------------------------------
    @property
    def trainer(self):
        if self._trainer is None:
            raise RuntimeError(f"{type(self).__name__} is not attached to a Trainer")
        return self._trainer

    @trainer.setter
    def trainer(self, trainer) -> None:
        object.__setattr__(self, "_trainer", trainer)

    @property
    def device(self) -> torch.device:
        for p in self.parameters():
            return p.device
        return torch.device("cpu")

    @property
    def global_rank(self) -> int:
        return self._trainer.global_rank if self._trainer is not None else 0

    @property
    def current_epoch(self) -> int:
        return self._trainer.current_epoch if self._trainer is not None else 0

    @property
    def global_step(self) -> int:
        return self._trainer.global_step if self._trainer is not None else 0

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on global rank 0 only."""
        rank_zero_print(*args, **kwargs)

    # -- hyperparameters --------------------------------------------------------------------
    def save_hyperparameters(self, *names: str, ignore: list[str] | str | None = None) -> None:
        """Record the caller's ``__init__`` arguments in ``self.hparams``.

        They are stored in checkpoints and sent to loggers. ``names`` picks some; ``ignore``
        leaves some out (e.g. a large tensor).
        """
        frame = inspect.currentframe().f_back
        code = frame.f_code  # the __init__ that called us (a subclass may have another signature)
        arg_names = code.co_varnames[1 : code.co_argcount + code.co_kwonlyargcount]
        args = {k: frame.f_locals[k] for k in arg_names if k in frame.f_locals}
        if code.co_flags & inspect.CO_VARKEYWORDS:  # **kwargs are flattened into hparams
            varkw = code.co_varnames[code.co_argcount + code.co_kwonlyargcount
                                     + bool(code.co_flags & inspect.CO_VARARGS)]
            args.update(frame.f_locals.get(varkw, {}))
        if names:
            args = {k: v for k, v in args.items() if k in names}
        ignored = {ignore} if isinstance(ignore, str) else set(ignore or ())
        self.hparams.update({k: v for k, v in args.items() if k not in ignored})

    # -- logging ------------------------------------------------------------------------------
    def log(
        self,
        name: str,
        value: Any,
        prog_bar: bool = False,
        logger: bool = True,
        on_step: bool | None = None,
        on_epoch: bool | None = None,
        reduce_fx: str = "mean",
        sync_dist: bool = False,
        batch_size: int | None = None,
    ) -> None:
        """Log a tensor, a number or a torchmetrics ``Metric``.

        Defaults follow Lightning: in ``training_step`` ``on_step=True, on_epoch=False``;
        in validation/test ``on_step=False, on_epoch=True``. Epoch values are the mean weighted
        by batch size (``batch_size`` or the size of the batch's first tensor); a ``Metric`` is
        computed at epoch end and reset. ``sync_dist=True`` reduces the epoch value across ranks.
        """
        if self._trainer is None:
            return
        self._trainer.metrics.log(
            name, value, prog_bar=prog_bar, logger=logger, on_step=on_step, on_epoch=on_epoch,
            reduce_fx=reduce_fx, sync_dist=sync_dist, batch_size=batch_size,
        )

    def log_dict(self, dictionary: Mapping[str, Any], **kwargs: Any) -> None:
        for name, value in dictionary.items():
            self.log(name, value, **kwargs)

    # -- steps (override) ---------------------------------------------------------------------
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement training_step(batch, batch_idx)")

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        return None

    def test_step(self, batch: Any, batch_idx: int) -> Any:
        return None

    def predict_step(self, batch: Any, batch_idx: int) -> Any:
        x = batch[0] if isinstance(batch, (list, tuple)) else batch
        return self(x)

    def configure_optimizers(self) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement configure_optimizers()")

    # -- hooks (override what you need; empty ones cost nothing per step) -------------------
    def on_fit_start(self) -> None: ...
    def on_fit_end(self) -> None: ...
    def on_train_start(self) -> None: ...
    def on_train_end(self) -> None: ...
    def on_train_epoch_start(self) -> None: ...
    def on_train_epoch_end(self) -> None: ...
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None: ...
    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None: ...
    def on_validation_epoch_start(self) -> None: ...
    def on_validation_epoch_end(self) -> None: ...
    def on_test_epoch_start(self) -> None: ...
    def on_test_epoch_end(self) -> None: ...
    def on_predict_epoch_start(self) -> None: ...
    def on_predict_epoch_end(self) -> None: ...
    def on_before_backward(self, loss: torch.Tensor) -> None: ...
    def on_after_backward(self) -> None: ...
    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None: ...
    def on_save_checkpoint(self, checkpoint: dict) -> None: ...
    def on_load_checkpoint(self, checkpoint: dict) -> None: ...
