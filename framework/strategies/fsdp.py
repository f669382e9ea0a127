"""Fully sharded data parallel (FSDP2, ``torch.distributed.fsdp.fully_shard``): each rank holds
1/N of the parameters, gradients and optimizer state, and gathers a unit's parameters just
before that unit runs.

The units are the submodules whose class is in ``auto_wrap_policy`` (Lightning's argument: a set
of classes, or their names in a recipe), then the root. The root is a ``StepModule`` around the
TrainModule, so every step (training, validation, test, predict) runs inside the root's forward
and parameters owned by no smaller unit are gathered for it too. ``configure_model()`` has run
before sharding; ``configure_optimizers()`` runs after it, so the optimizers see the sharded
parameters (an optimizer over the unsharded ones would step tensors that no longer train: it is
refused).

Checkpoints (this step): ``state_dict_type="full"``, Lightning's FSDP default. Every rank takes
part in gathering the full model and optimizer state, rank 0 writes the one file fw writes for
DDP (offloaded to the CPU: no device holds the whole state), and loading shards the file's
full state onto every rank. The optimizer state is keyed by parameter name.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from framework.errors import CheckpointError, ConfigError
from framework.strategies.base import StepModule
from framework.strategies.ddp import DDPStrategy
from framework.strategies.distributed import DEFAULT_TIMEOUT_S

if TYPE_CHECKING:
    from framework.module import TrainModule
    from framework.trainer.parts import CheckpointParts

#: Lightning's sharding strategies that this step runs, and whether each reshards after forward
SHARDING = {"FULL_SHARD": True, "SHARD_GRAD_OP": False}
#: the precisions FSDP runs here (the others need a mixed-precision policy: a later step)
PRECISIONS = ("32", "32-true")


class FSDPStrategy(DDPStrategy):
    """FSDP2 over Gloo (CPU) or NCCL (CUDA), one process per device; fw's launcher or torchrun
    starts the processes, as for DDP.

    Args:
        auto_wrap_policy: the submodule classes to shard as units of their own (a set of
            classes, or of class names as a recipe writes them); the root is always a unit.
        sharding_strategy: ``FULL_SHARD`` (parameters resharded after each unit's forward) or
            ``SHARD_GRAD_OP`` (kept gathered from forward to backward: more memory, fewer
            all-gathers).
        state_dict_type: ``full`` (one file, as for DDP).
        backend, init_method, timeout, socket_ifname: as for ``ddp``.
    """

    allows_inference_mode = False  # the all-gather buffers made in evaluation are reused by training

    def __init__(
        self,
        auto_wrap_policy: Iterable[type[nn.Module] | str] | None = None,
        sharding_strategy: str = "FULL_SHARD",
        state_dict_type: str = "full",
        backend: str = "gloo",
        init_method: str = "env://",
        timeout: float = DEFAULT_TIMEOUT_S,
        socket_ifname: str | None = None,
    ) -> None:
        super().__init__(backend=backend, init_method=init_method, timeout=timeout, socket_ifname=socket_ifname)
        self.name = "fsdp"
        self.wrap_classes = _class_names(auto_wrap_policy)
        if str(sharding_strategy).upper() not in SHARDING:
            raise ConfigError(f"trainer.strategy.sharding_strategy: '{sharding_strategy}' is not one fw runs; "
                              f"use {' or '.join(SHARDING)}")
        self.reshard_after_forward = SHARDING[str(sharding_strategy).upper()]
        if state_dict_type != "full":
            raise ConfigError(f"trainer.strategy.state_dict_type: '{state_dict_type}' is not one fw writes yet; "
                              "use full (one file, gathered on rank 0 through the CPU)")
        self.module: TrainModule | None = None

    def setup_module(self, module: TrainModule) -> nn.Module:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        trainer_precision = getattr(getattr(module, "trainer", None), "precision", None)
        precision = getattr(trainer_precision, "precision", "32-true")
        if precision not in PRECISIONS:
            raise ConfigError(f"trainer.precision={precision} with strategy fsdp: this fw runs FSDP in 32-true "
                              "only; use trainer.precision=32-true, or strategy ddp for mixed precision")
        module.to(self.root_device)
        units = _units(module, self.wrap_classes)
        mesh = init_device_mesh(self.root_device.type, (self.world_size,))
        for unit in units:
            fully_shard(unit, mesh=mesh, reshard_after_forward=self.reshard_after_forward)
        root = StepModule(module)
        fully_shard(root, mesh=mesh, reshard_after_forward=self.reshard_after_forward)
        self.model, self.module = root, module
        return root

    def training_step_fn(self, module: TrainModule) -> Callable[..., Any]:
        assert self.model is not None, "setup_module() first"
        return self.model  # the root's forward gathers its parameters, then runs the step

    def step_fn(self, module: TrainModule, name: str) -> Callable[..., Any]:
        assert self.model is not None, "setup_module() first"
        root = self.model
        return lambda *args: root(*args, step=name)

    def check_optimizers(self, optimizers: list[torch.optim.Optimizer]) -> None:
        from torch.distributed.tensor import DTensor

        for i, optimizer in enumerate(optimizers):
            plain = [p for group in optimizer.param_groups for p in group["params"] if not isinstance(p, DTensor)]
            if plain:
                raise ConfigError(
                    f"optimizer {i} ({type(optimizer).__name__}) holds {len(plain)} parameter(s) that FSDP did not "
                    "shard (built before sharding, e.g. in __init__): it would step tensors the model no longer "
                    "uses. Build it in configure_optimizers() from self.parameters()")

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        yield  # gradients are reduce-scattered after every backward: they stay sharded

    def average_gradients(self, params: list[torch.nn.Parameter]) -> None:
        """FSDP's backward already reduced the gradients (manual optimization too)."""

    def teardown(self) -> None:
        super().teardown()
        self.module = None

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "sharding": "full shard" if self.reshard_after_forward else "shard grad op"}

    # -- checkpoints ----------------------------------------------------------------------
    def save_checkpoint(self, path: str, parts: CheckpointParts) -> None:
        """Every rank gathers the full state (rank 0 keeps it, on the CPU); rank 0 writes it."""
        from dataclasses import replace

        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        from framework.strategies.checkpoint_io import save_from_rank_zero
        from framework.trainer.parts import Value

        module = self._sharded_module()
        full = StateDictOptions(full_state_dict=True, cpu_offload=True)
        shared = dict(parts.shared)
        weights = get_model_state_dict(module, options=full)
        shared["state_dict"] = Value(lambda: weights, _no_put)
        if "optimizer_states" in shared:
            optimizers = list(getattr(shared["optimizer_states"], "items", []))
            states = [get_optimizer_state_dict(module, opt, options=full) for opt in optimizers]
            shared["optimizer_states"] = Value(lambda: states, _no_put)
        save_from_rank_zero(self, path, replace(parts, shared=shared,
                                                values={**parts.values, "fw_optimizer_keys": "names"}))

    def load_checkpoint(self, path: str, parts: CheckpointParts) -> dict[str, Any]:
        """Every rank reads the file and shards its full state onto this rank's parameters."""
        from dataclasses import replace

        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        from framework import checkpoint as ckpt
        from framework.strategies.checkpoint_io import load_on_every_rank
        from framework.trainer.parts import OnLoad, Value

        module = self._sharded_module()
        full = StateDictOptions(full_state_dict=True)

        def put_weights(weights: dict) -> None:
            try:
                set_model_state_dict(module, weights, options=full)
            except (RuntimeError, KeyError, ValueError) as err:
                raise CheckpointError(f"checkpoint '{path}' does not fit this model: "
                                      f"{ckpt.state_dict_mismatch(err)}") from None

        shared = dict(parts.shared)
        shared["state_dict"] = Value(_no_get, put_weights)
        if "optimizer_states" in shared:
            optimizers = list(getattr(shared["optimizer_states"], "items", []))

            def put_optimizers(states: list) -> None:
                _refuse_other_optimizer_keys(path, checkpoint_keys[0])
                if len(states) != len(optimizers):
                    raise CheckpointError(f"checkpoint '{path}' holds {len(states)} optimizer state(s) and "
                                          f"configure_optimizers() returned {len(optimizers)}: resume with the "
                                          "configure_optimizers() it was written with")
                for opt, state in zip(optimizers, states, strict=True):
                    set_optimizer_state_dict(module, opt, state, options=full)

            shared["optimizer_states"] = Value(_no_get, put_optimizers)
        checkpoint_keys: list[str | None] = [None]
        first = shared.pop("fw/on_read", None)

        def read_keys(checkpoint: dict) -> None:
            checkpoint_keys[0] = checkpoint.get("fw_optimizer_keys")
            if isinstance(first, OnLoad):
                first(checkpoint)

        return load_on_every_rank(self, path, replace(parts, shared={"fw/on_read": OnLoad(read_keys), **shared}))

    def _sharded_module(self) -> TrainModule:
        if self.module is None:
            raise CheckpointError("an FSDP checkpoint is written and read while the run's process group is up "
                                  "(inside fit, validate, test or predict)")
        return self.module


def _class_names(policy: Iterable[type[nn.Module] | str] | None) -> set[str]:
    """The names of the unit classes (a class's ``__name__``, or the name a recipe gave)."""
    if policy is None:
        return set()
    if isinstance(policy, (str, type)):
        policy = [policy]
    names = set()
    for item in policy:
        if isinstance(item, type) and issubclass(item, nn.Module):
            names.add(item.__name__)
        elif isinstance(item, str) and item:
            names.add(item.rsplit(".", 1)[-1])
        else:
            raise ConfigError(f"trainer.strategy.auto_wrap_policy: {item!r} is not a module class or its name; "
                              "give the classes of the blocks to shard, e.g. {Block} or [Block]")
    return names


def _units(module: nn.Module, names: set[str]) -> list[nn.Module]:
    """The submodules to shard as units, innermost first; a named class the model lacks is an error."""
    found = [m for m in module.modules() if m is not module and type(m).__name__ in names]
    missing = names - {type(m).__name__ for m in found}
    if missing:
        have = sorted({type(m).__name__ for m in module.modules() if m is not module})
        raise ConfigError(f"trainer.strategy.auto_wrap_policy: {type(module).__name__} has no submodule of class "
                          f"{', '.join(sorted(missing))}; its submodules' classes: {', '.join(have) or 'none'}")
    return list(reversed(found))  # modules() lists parents first: shard the children before them


def _refuse_other_optimizer_keys(path: str, keys: str | None) -> None:
    if keys != "names":
        raise CheckpointError(f"checkpoint '{path}' was written by another strategy (its optimizer state is keyed by "
                              "position): resuming it under fsdp is not supported yet; load its weights alone "
                              "(validate/test/predict, or Model.load_from_checkpoint) or resume with the strategy "
                              "that wrote it")


def _no_put(_: Any) -> None:
    raise AssertionError("a saving part is not loaded")


def _no_get() -> Any:
    raise AssertionError("a loading part is not saved")
