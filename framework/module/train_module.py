"""``TrainModule``: the user's model, its steps, its optimisers, ``self.log``.

A ``TrainModule`` is an ``nn.Module`` with Lightning's method names: the hooks Lightning calls
(and their defaults) are in ``hooks.py``, ``save_hyperparameters`` and ``load_from_checkpoint`` in
``hparams.py``, ``to_onnx`` and ``to_torchscript`` in ``export.py``, ``device`` and Lightning's
other plain attributes in ``attributes.py``, what ``self.optimizers()`` returns in
``manual_optimization.py``. The Trainer attaches itself (``self.trainer``) before any hook runs;
``self.log`` records a metric in the Trainer's collector for the current stage.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from framework.errors import ConfigError
from framework.module.attributes import ModuleAttributes
from framework.module.export import JIT_IGNORED_ATTRIBUTES, ModuleExport, jit_unused_properties
from framework.module.hooks import ModuleHooks, unwrapped
from framework.module.hparams import HyperparametersMixin
from framework.module.manual_optimization import TrainOptimizer
from framework.rank_zero import rank_zero_print

if TYPE_CHECKING:
    from framework.loggers import Logger
    from framework.trainer import Trainer


class TrainModule(HyperparametersMixin, ModuleHooks, ModuleAttributes, ModuleExport, nn.Module):
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

    # Set with object.__setattr__, past nn.Module's __setattr__ (these are no parameters, buffers
    # or sub-modules); declared here so that their types are known.
    _trainer: Trainer | None
    _automatic_optimization: bool
    _toggled: dict[torch.Tensor, bool]

    def __init__(self) -> None:
        super().__init__()
        object.__setattr__(self, "_trainer", None)
        object.__setattr__(self, "_automatic_optimization", True)
        object.__setattr__(self, "_toggled", {})

    # -- where the module stands ------------------------------------------------------------
    @property
    def trainer(self) -> Trainer:
        trainer = self._trainer
        if trainer is None:
            if self.__dict__.get("_jit_is_scripting"):  # to_torchscript reads every name
                return None  # type: ignore[return-value]
            raise RuntimeError(f"{type(self).__name__} is not attached to a Trainer")
        return trainer

    @trainer.setter
    def trainer(self, trainer: Trainer | None) -> None:
        object.__setattr__(self, "_trainer", trainer)

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
    def logger(self) -> Logger | None:
        """The Trainer's first logger, or None."""
        return self._trainer.logger if self._trainer is not None else None

    @property
    def loggers(self) -> list[Logger]:
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
    def device_mesh(self) -> Any:
        """The strategy's ``DeviceMesh`` (``model_parallel``: dimensions ``data_parallel`` and
        ``tensor_parallel``), for ``configure_model`` to parallelize over; None elsewhere."""
        return self._trainer.strategy.device_mesh if self._trainer is not None else None

    @property
    def current_epoch(self) -> int:
        return self._trainer.current_epoch if self._trainer is not None else 0

    @property
    def global_step(self) -> int:
        return self._trainer.global_step if self._trainer is not None else 0

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on global rank 0 only."""
        rank_zero_print(*args, **kwargs)

    # -- optimization (Lightning's names; manual optimization in manual_optimization.py) ------
    @property
    def automatic_optimization(self) -> bool:
        """False: ``training_step`` drives the optimizers itself (``self.optimizers()``,
        ``self.manual_backward``); the loop only calls it."""
        return self._automatic_optimization

    @automatic_optimization.setter
    def automatic_optimization(self, value: bool) -> None:
        object.__setattr__(self, "_automatic_optimization", bool(value))

    def optimizers(self, use_pl_optimizer: bool = True) -> Any:
        """The optimizers from ``configure_optimizers``: one, or a list when there are several
        (``Any``, as the count decides). Their ``step`` does what a step needs under this run's
        strategy and precision."""
        trainer = self.trainer
        opts = trainer.optimizers
        if use_pl_optimizer:
            cached = self.__dict__.get("_wrapped_optimizers")  # the same wrappers on every call
            if cached is None or [w.optimizer for w in cached] != opts:
                cached = [TrainOptimizer(opt, trainer) for opt in opts]
                object.__setattr__(self, "_wrapped_optimizers", cached)
            opts = cached
        return opts[0] if len(opts) == 1 else list(opts)

    def lr_schedulers(self) -> Any:
        """The LR schedulers from ``configure_optimizers``: None, one, or a list."""
        schedulers = [cfg.scheduler for cfg in self.trainer.lr_scheduler_configs]
        if not schedulers:
            return None
        return schedulers[0] if len(schedulers) == 1 else schedulers

    def manual_backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """Backward in manual optimization: scaled under 16-mixed, with the backward hooks;
        ``args``/``kwargs`` go to ``Tensor.backward``."""
        run = self.trainer.run
        manual = run.manual if run is not None else None
        if manual is None:
            raise RuntimeError("manual_backward is for manual optimization: set self.automatic_optimization = False "
                               "in __init__, or return the loss from training_step")
        manual.backward(loss, *args, **kwargs)

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """The backward of a training loss (already scaled under ``16-mixed``); override to
        change it. ``manual_backward`` calls it too."""
        loss.backward(*args, **kwargs)

    def toggle_optimizer(self, optimizer: torch.optim.Optimizer | TrainOptimizer) -> None:
        """Only ``optimizer``'s parameters require gradients until ``untoggle_optimizer``: the
        parameters of the other optimizers are frozen (their previous flags are kept)."""
        optimizer = unwrapped(optimizer)
        state: dict[torch.Tensor, bool] = {}
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

    def untoggle_optimizer(self, optimizer: torch.optim.Optimizer | TrainOptimizer) -> None:
        """Give the other optimizers' parameters back the flags they had before the toggle."""
        optimizer = unwrapped(optimizer)
        for opt in self.trainer.optimizers:
            if opt is optimizer:
                continue
            for group in opt.param_groups:
                for param in group["params"]:
                    if param in self._toggled:
                        param.requires_grad = self._toggled[param]
        object.__setattr__(self, "_toggled", {})

    @contextlib.contextmanager
    def toggled_optimizer(self, optimizer: torch.optim.Optimizer | TrainOptimizer) -> Iterator[None]:
        self.toggle_optimizer(optimizer)
        try:
            yield
        finally:
            self.untoggle_optimizer(optimizer)

    # -- logging ------------------------------------------------------------------------------
    def log(self, name: str, value: Any, prog_bar: bool = False, logger: bool = True, on_step: bool | None = None,
            on_epoch: bool | None = None, reduce_fx: Any = "mean", enable_graph: bool = False, sync_dist: bool = False,
            sync_dist_group: Any = None, add_dataloader_idx: bool = True, batch_size: int | None = None,
            metric_attribute: str | None = None, rank_zero_only: bool = False) -> None:
        """Log a tensor, a number or a torchmetrics ``Metric`` (Lightning's arguments, in its order).

        Defaults follow Lightning: in ``training_step`` ``on_step=True, on_epoch=False``;
        in validation/test ``on_step=False, on_epoch=True``. Epoch values are the mean weighted
        by batch size (``batch_size`` or the size of the batch's first tensor); a ``Metric`` is
        computed at epoch end and reset. ``sync_dist=True`` reduces the epoch value across ranks
        (not with ``rank_zero_only=True``, as in Lightning); see ``trainer/log_options.py``.
        """
        if self._trainer is None:
            return
        if self._trainer.state.stage is None:  # between calls: nothing would ever read it (Lightning refuses it too)
            raise ConfigError(f"self.log('{name}') outside fit/validate/test: log in a hook or a step, or write "
                              "to trainer.loggers directly")
        self._trainer.metrics.log(
            name, value, prog_bar=prog_bar, logger=logger, on_step=on_step, on_epoch=on_epoch, reduce_fx=reduce_fx,
            enable_graph=enable_graph, sync_dist=sync_dist, sync_dist_group=sync_dist_group,
            add_dataloader_idx=add_dataloader_idx, batch_size=batch_size, metric_attribute=metric_attribute,
            rank_zero_only=rank_zero_only)

    def log_dict(self, dictionary: Mapping[str, Any], **kwargs: Any) -> None:
        for name, value in dictionary.items():
            self.log(name, value, **kwargs)

    # -- steps (override) ---------------------------------------------------------------------
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        """Required: one training batch's loss (a tensor, or a dict with it under ``"loss"``); None skips the batch."""
        raise NotImplementedError(f"{type(self).__name__} must implement training_step(batch, batch_idx)")

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        """One validation batch: ``self.log`` its metrics. Fit validates only when this is overridden."""
        return None

    def test_step(self, batch: Any, batch_idx: int) -> Any:
        """One batch of ``trainer.test``: ``self.log`` its metrics."""
        return None

    def predict_step(self, batch: Any, batch_idx: int) -> Any:
        """One ``trainer.predict`` batch; the default: ``self(batch)``, or ``self(batch[0])`` for a list or tuple."""
        x = batch[0] if isinstance(batch, (list, tuple)) else batch
        return self(x)

    def configure_optimizers(self) -> Any:
        """Required to fit: an optimizer, ``(optimizers, schedulers)`` or a dict (``optimizer``, ``lr_scheduler``)."""
        raise NotImplementedError(f"{type(self).__name__} must implement configure_optimizers()")


#: what ``to_torchscript`` must not compile (each reads the Trainer), as Lightning lists them
TrainModule.__jit_unused_properties__ = jit_unused_properties(TrainModule)  # type: ignore[attr-defined]
TrainModule.__jit_ignored_attributes__ = JIT_IGNORED_ATTRIBUTES  # type: ignore[attr-defined]

#: Lightning's name, for code written against ``import lightning as L`` (``L.LightningModule``)
LightningModule = TrainModule
