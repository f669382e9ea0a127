"""``TrainModule``: the user's model, its steps, its optimisers and its hooks.

A ``TrainModule`` is an ``nn.Module`` with Lightning's method names. The Trainer attaches itself
(``self.trainer``) before any hook runs; ``self.log`` records a metric in the Trainer's
collector for the current stage.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
from argparse import Namespace
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from framework.errors import ConfigError
from framework.rank_zero import rank_zero_print


class AttributeDict(dict):
    """A dict whose keys are also attributes (``self.hparams.lr``), as Lightning's hparams."""

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError as err:
            raise AttributeError(f"hparams has no '{key}'; it has: {', '.join(map(str, self)) or 'nothing'}") from err

    def __setattr__(self, key: str, value: Any) -> None:
        self[key] = value

    def __delattr__(self, key: str) -> None:
        del self[key]


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
        object.__setattr__(self, "hparams", AttributeDict())
        object.__setattr__(self, "_hparams_initial", AttributeDict())
        object.__setattr__(self, "_automatic_optimization", True)
        object.__setattr__(self, "_toggled", {})

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
    def local_rank(self) -> int:
        return self._trainer.local_rank if self._trainer is not None else 0

    @property
    def dtype(self) -> torch.dtype:
        for p in self.parameters():
            return p.dtype
        return torch.get_default_dtype()

    @property
    def logger(self):
        """The Trainer's first logger, or None."""
        return self._trainer.logger if self._trainer is not None else None

    @property
    def loggers(self) -> list:
        return list(self._trainer.loggers) if self._trainer is not None else []

    @property
    def example_input_array(self) -> Any:
        """An input for ``forward`` (set it in ``__init__``): the model summary then shows
        each layer's input and output shapes."""
        return self.__dict__.get("_example_input_array")

    @example_input_array.setter
    def example_input_array(self, value: Any) -> None:
        object.__setattr__(self, "_example_input_array", value)

    def freeze(self) -> None:
        """No parameter requires gradients, and eval mode."""
        for p in self.parameters():
            p.requires_grad = False
        self.eval()

    def unfreeze(self) -> None:
        for p in self.parameters():
            p.requires_grad = True
        self.train()

    def all_gather(self, data: Any, group: Any = None, sync_grads: bool = False) -> Any:
        """Tensors (or a dict/list/tuple of them) stacked from every rank along a new first
        dimension; in one process the data come back unchanged, as in Lightning."""
        if self._trainer is None or not self._trainer.strategy.is_distributed:
            return data
        strategy = self._trainer.strategy
        if isinstance(data, torch.Tensor):
            if sync_grads:
                import torch.distributed.nn.functional as dist_fn

                return torch.stack(dist_fn.all_gather(data.contiguous()))
            return strategy.all_gather(data.to(strategy.collective_device)).to(data.device)
        if isinstance(data, dict):
            return {k: self.all_gather(v, group, sync_grads) for k, v in data.items()}
        if isinstance(data, (list, tuple)):
            return type(data)(self.all_gather(v, group, sync_grads) for v in data)
        return data

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
    def save_hyperparameters(self, *args: Any, ignore: list[str] | str | None = None, frame=None,
                             logger: bool = True) -> None:
        """Record the caller's ``__init__`` arguments in ``self.hparams`` (attribute access:
        ``self.hparams.lr``), as Lightning does.

        They are stored in checkpoints (``load_from_checkpoint`` rebuilds the module from them)
        and sent to loggers. ``args`` picks some by name, or is one dict / ``Namespace`` to save
        instead; ``ignore`` leaves some out (e.g. a large tensor or a sub-module).
        """
        frame = frame or inspect.currentframe().f_back
        if len(args) == 1 and isinstance(args[0], (dict, Namespace)):
            given = args[0]
            found = dict(vars(given) if isinstance(given, Namespace) else given)
        else:
            code = frame.f_code  # the __init__ that called us (a subclass may have another signature)
            arg_names = code.co_varnames[1 : code.co_argcount + code.co_kwonlyargcount]
            found = {k: frame.f_locals[k] for k in arg_names if k in frame.f_locals}
            if code.co_flags & inspect.CO_VARKEYWORDS:  # **kwargs are flattened into hparams
                varkw = code.co_varnames[code.co_argcount + code.co_kwonlyargcount
                                         + bool(code.co_flags & inspect.CO_VARARGS)]
                found.update(frame.f_locals.get(varkw, {}))
            if args:
                found = {k: v for k, v in found.items() if k in args}
        ignored = {ignore} if isinstance(ignore, str) else set(ignore or ())
        self.hparams.update({k: v for k, v in found.items() if k not in ignored})
        object.__setattr__(self, "_hparams_initial", copy.deepcopy(self.hparams))

    @property
    def hparams_initial(self) -> AttributeDict:
        """The hyperparameters as ``save_hyperparameters`` recorded them (later edits of
        ``self.hparams`` do not show here)."""
        return copy.deepcopy(self._hparams_initial)

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path: Any, map_location: Any = None, hparams_file: Any = None,
                             strict: bool | None = None, **kwargs: Any):
        """A module of this class rebuilt from a checkpoint: ``__init__`` gets the saved
        hyperparameters (``save_hyperparameters``), overridden by ``kwargs``; then the weights
        are loaded. ``map_location`` as in ``torch.load``."""
        from framework.checkpoint import load_from_checkpoint

        return load_from_checkpoint(cls, checkpoint_path, map_location=map_location, strict=strict, **kwargs)

    # -- optimization (Lightning's names; manual optimization in framework/loops/manual.py) ----
    @property
    def automatic_optimization(self) -> bool:
        """False: ``training_step`` drives the optimizers itself (``self.optimizers()``,
        ``self.manual_backward``); the loop only calls it."""
        return self._automatic_optimization

    @automatic_optimization.setter
    def automatic_optimization(self, value: bool) -> None:
        object.__setattr__(self, "_automatic_optimization", bool(value))

    def optimizers(self, use_pl_optimizer: bool = True):
        """The optimizers from ``configure_optimizers``: one, or a list when there are several.
        Their ``step`` does what a step needs under this run's strategy and precision."""
        from framework.loops.manual import ManualOptimizer

        trainer = self.trainer
        opts = trainer.optimizers
        if use_pl_optimizer:
            cached = self.__dict__.get("_wrapped_optimizers")  # the same wrappers on every call
            if cached is None or [w.optimizer for w in cached] != opts:
                cached = [ManualOptimizer(opt, trainer) for opt in opts]
                object.__setattr__(self, "_wrapped_optimizers", cached)
            opts = cached
        return opts[0] if len(opts) == 1 else list(opts)

    def lr_schedulers(self):
        """The LR schedulers from ``configure_optimizers``: None, one, or a list."""
        schedulers = [cfg.scheduler for cfg in self.trainer.lr_scheduler_configs]
        if not schedulers:
            return None
        return schedulers[0] if len(schedulers) == 1 else schedulers

    def manual_backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """Backward in manual optimization: scaled under 16-mixed, with the backward hooks;
        ``args``/``kwargs`` go to ``Tensor.backward``."""
        manual = getattr(self.trainer, "manual", None)
        if manual is None:
            raise RuntimeError("manual_backward is for manual optimization: set self.automatic_optimization = False "
                               "in __init__, or return the loss from training_step")
        manual.backward(loss, *args, **kwargs)

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """The backward of a training loss (already scaled under ``16-mixed``); override to
        change it. ``manual_backward`` calls it too."""
        loss.backward(*args, **kwargs)

    def toggle_optimizer(self, optimizer) -> None:
        """Only ``optimizer``'s parameters require gradients until ``untoggle_optimizer``: the
        parameters of the other optimizers are frozen (their previous flags are kept)."""
        optimizer = getattr(optimizer, "optimizer", optimizer)
        state: dict = {}
        for opt in self.trainer.optimizers:
            for group in opt.param_groups:
                for param in group["params"]:
                    if param not in state:
                        state[param] = param.requires_grad
                        param.requires_grad = False
        for group in optimizer.param_groups:
            for param in group["params"]:
                param.requires_grad = state[param]
        object.__setattr__(self, "_toggled", state)

    def untoggle_optimizer(self, optimizer) -> None:
        """Give the other optimizers' parameters back the flags they had before the toggle."""
        optimizer = getattr(optimizer, "optimizer", optimizer)
        for opt in self.trainer.optimizers:
            if opt is optimizer:
                continue
            for group in opt.param_groups:
                for param in group["params"]:
                    if param in self._toggled:
                        param.requires_grad = self._toggled[param]
        object.__setattr__(self, "_toggled", {})

    @contextlib.contextmanager
    def toggled_optimizer(self, optimizer) -> Iterator[None]:
        self.toggle_optimizer(optimizer)
        try:
            yield
        finally:
            self.untoggle_optimizer(optimizer)

    def clip_gradients(self, optimizer, gradient_clip_val: float | None = None,
                       gradient_clip_algorithm: str | None = None) -> None:
        """Clip ``optimizer``'s gradients by norm (default) or value, as Lightning does: a value
        left None is the Trainer's (``gradient_clip_val``, ``gradient_clip_algorithm``), and one
        that contradicts the Trainer's is an error. In manual optimization the gradients are
        averaged over the ranks and unscaled first, so the clip sees the gradients the step will
        use."""
        from framework.loops.optimization import clip_gradients

        trainer = self.trainer
        manual = getattr(trainer, "manual", None)
        if manual is None:  # automatic optimization: the Trainer's settings are the defaults
            gradient_clip_val, gradient_clip_algorithm = _clip_settings(trainer, gradient_clip_val,
                                                                        gradient_clip_algorithm)
        if not gradient_clip_val:
            return
        algorithm = (gradient_clip_algorithm or "norm").lower()
        if algorithm not in ("norm", "value"):
            raise ValueError(f"gradient_clip_algorithm '{algorithm}': use 'norm' or 'value'")
        optimizer = getattr(optimizer, "optimizer", optimizer)
        if manual is not None:
            manual.prepare_gradients(optimizer)
        clip_gradients(optimizer, float(gradient_clip_val), algorithm)

    def configure_gradient_clipping(self, optimizer, gradient_clip_val: float | None = None,
                                    gradient_clip_algorithm: str | None = None) -> None:
        """Called before each optimizer step (after ``on_before_optimizer_step``) with the
        Trainer's clip settings; the default clips with ``self.clip_gradients``."""
        self.clip_gradients(optimizer, gradient_clip_val=gradient_clip_val,
                            gradient_clip_algorithm=gradient_clip_algorithm)

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer, optimizer_closure=None) -> None:
        """Step ``optimizer`` (override to change how, e.g. a learning-rate warm-up). The closure
        runs ``training_step``, ``zero_grad`` and ``backward``: call it, through
        ``optimizer.step(closure=optimizer_closure)`` or directly. Not called on the batches
        that only accumulate gradients."""
        optimizer.step(closure=optimizer_closure)

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer) -> None:
        """Zero the gradients: before the backward of the first batch of each accumulation
        window, as Lightning does."""
        optimizer.zero_grad()

    def lr_scheduler_step(self, scheduler, metric: Any) -> None:
        """Step a scheduler when its interval and frequency say so; ``metric`` is the monitored
        value for ``ReduceLROnPlateau`` (else None)."""
        if metric is None:
            scheduler.step()
        else:
            scheduler.step(metric)

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

    # -- data and set-up hooks (Lightning's; a DataModule's come first) -----------------------
    def prepare_data(self) -> None:
        """Download or write files: once per node (local rank 0), before ``setup``."""

    def setup(self, stage: str) -> None:
        """Build what the run needs on every rank (``stage``: fit, validate, test, predict);
        runs before the module's own ``*_dataloader()`` methods are asked for data."""

    def teardown(self, stage: str) -> None: ...

    def configure_model(self) -> None:
        """Build layers here instead of in ``__init__`` to create them where the run puts them
        (called once per run, after ``setup``, before ``configure_optimizers``; make it idempotent)."""

    def configure_callbacks(self):
        """Callbacks this module always wants (a list or one); they replace a Trainer callback
        of the same type, as in Lightning."""
        return []

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
    def on_validation_start(self) -> None: ...
    def on_validation_end(self) -> None: ...
    def on_test_start(self) -> None: ...
    def on_test_end(self) -> None: ...
    def on_predict_start(self) -> None: ...
    def on_predict_end(self) -> None: ...
    def on_validation_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_validation_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_test_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_test_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_predict_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_predict_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_before_zero_grad(self, optimizer: torch.optim.Optimizer) -> None: ...
    def on_before_backward(self, loss: torch.Tensor) -> None: ...
    def on_after_backward(self) -> None: ...
    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None: ...
    def on_save_checkpoint(self, checkpoint: dict) -> None: ...
    def on_load_checkpoint(self, checkpoint: dict) -> None: ...

    # -- evaluation modes and batch transfer (Lightning's defaults) ---------------------------
    def on_validation_model_zero_grad(self) -> None:
        """Before validation inside fit: free the gradients (``zero_grad``)."""
        self.zero_grad()

    def on_validation_model_eval(self) -> None:
        self.trainer.model.eval()

    def on_validation_model_train(self) -> None:
        """After validation: the default puts back each submodule's own mode from before."""
        self.trainer.model.train()

    def on_test_model_eval(self) -> None:
        self.trainer.model.eval()

    def on_test_model_train(self) -> None:
        self.trainer.model.train()

    def on_predict_model_eval(self) -> None:
        self.trainer.model.eval()

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Change a batch before it moves to the device (on the CPU)."""
        return batch

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        """Move a batch to ``device``: tensors in lists, tuples, dicts and dataclasses, and
        anything with ``.to``."""
        from framework.accelerators.base import move_to_device

        return move_to_device(batch, device)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Change a batch after it moved to the device (e.g. augment it on the GPU)."""
        return batch


def _clip_settings(trainer, value: float | None, algorithm: str | None) -> tuple[float | None, str | None]:
    """Lightning's rule: an argument left None is the Trainer's; one that contradicts it is an error."""
    if value is None:
        value = trainer.gradient_clip_val or 0.0
    elif trainer.gradient_clip_val is not None and trainer.gradient_clip_val != value:
        raise ConfigError(f"clip_gradients(gradient_clip_val={value}) contradicts trainer.gradient_clip_val="
                          f"{trainer.gradient_clip_val}; set one of them")
    trainer_algorithm = trainer.gradient_clip_algorithm
    if algorithm is None:
        algorithm = trainer_algorithm or "norm"
    elif trainer_algorithm is not None and trainer_algorithm != algorithm.lower():
        raise ConfigError(f"clip_gradients(gradient_clip_algorithm='{algorithm}') contradicts "
                          f"trainer.gradient_clip_algorithm='{trainer_algorithm}'; set one of them")
    return value, algorithm
