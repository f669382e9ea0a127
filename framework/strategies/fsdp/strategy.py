"""Fully sharded data parallel (FSDP2, ``torch.distributed.fsdp.fully_shard``): each rank holds
1/N of the parameters, gradients and optimizer state, and gathers a unit's parameters just
before that unit runs.

The units are the submodules whose class is in ``auto_wrap_policy`` (Lightning's argument: a set of
classes, or their names in a recipe; one tied to a module outside it stays in the unit around both), then the root. The root is a ``StepModule`` around the
TrainModule, so every step (training, validation, test, predict) runs inside the root's forward and
parameters owned by no smaller unit are gathered for it too (and kept for the backward:
``resharding.py``). ``configure_model()`` has run before sharding; ``configure_optimizers()`` runs
after it, so the optimizers see the sharded parameters (an optimizer over the unsharded ones would
step tensors that no longer train: it is refused). ``HYBRID_SHARD`` shards over one dimension of a
2-D mesh and replicates over the other (HSDP); ``bf16-mixed`` gathers and computes in bfloat16 and
reduces in float32 into float32 shards. Evaluation runs under ``no_grad``, never ``inference_mode``
(FSDP's buffers made there could not be written by the training step after it). A parameter a
rank did not use at a step (a routed head) is reduced with a zero gradient there, as under DDP's
``find_unused_parameters``; one no rank used gets a zero gradient, where DDP leaves it ``None``
(an optimizer with momentum or weight decay then still moves it).

After a call the module stays sharded and its group up (until the process ends) for the next
call on it (``fit`` then ``test``), as in Lightning; sharding it another way is refused. A model
built on the meta device (``trainer.init_module()``) is made real shard by shard (``materialize.py``).

Checkpoints: ``state_dict_type="sharded"`` (the default) writes a folder that every rank writes
its own shards into (``sharded_checkpoint.py``: nothing is gathered); ``"full"`` (Lightning's FSDP
default) gathers the full model and optimizer state through rank 0's CPU into the one file fw
writes for DDP (``full_checkpoint.py``). Either loads on any number of ranks, and under DDP or
in one process; the optimizer state is keyed by parameter name.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from framework.errors import CheckpointError, ConfigError
from framework.parallel.blocks import class_names, units
from framework.strategies.base import StepModule
from framework.strategies.ddp import DDPStrategy
from framework.strategies.distributed import DEFAULT_TIMEOUT_S, destroy_groups_at_exit
from framework.strategies.fsdp.materialize import has_meta_tensors, materialize, recording_makers
from framework.strategies.fsdp.options import mesh_shape, precision_policy, without_split_ties

if TYPE_CHECKING:
    from framework.checkpointing.parts import CheckpointParts
    from framework.module import TrainModule
    from framework.strategies.fsdp.async_save import PendingSave
    from framework.strategies.fsdp.resharding import ManualSteps

#: Lightning's sharding strategies that fw runs, and whether each reshards after forward
SHARDING = {"FULL_SHARD": True, "SHARD_GRAD_OP": False, "HYBRID_SHARD": True}


class FSDPStrategy(DDPStrategy):
    """FSDP2 over Gloo (CPU) or NCCL (CUDA), one process per device; fw's launcher or torchrun
    starts the processes, as for DDP.

    Args:
        auto_wrap_policy: the submodule classes to shard as units of their own (a set of
            classes, or of class names as a recipe writes them); the root is always a unit.
        sharding_strategy: ``FULL_SHARD`` (each unit's parameters resharded after its forward, the
            root's after the backward), ``SHARD_GRAD_OP`` (all kept from forward to backward: more
            memory, fewer all-gathers) or ``HYBRID_SHARD``: full shard within groups of
            ``device_mesh[1]`` ranks, replicated over ``device_mesh[0]`` such groups (default: shard
            within a node, replicate across).
        device_mesh: ``[replicas, shard size]`` for ``HYBRID_SHARD``.
        state_dict_type: ``sharded`` (a folder every rank writes its shards into:
            ``sharded_checkpoint.py``) or ``full`` (one file, as for DDP, gathered through rank 0's CPU).
        async_save: write sharded checkpoints while training goes on (``async_save.py``).
        cpu_offload: keep the shards (parameters, gradients, optimizer state) in CPU memory and
            step the optimizer there; each unit's parameters go to the device for its compute.
        activation_checkpointing_policy: as the Trainer's (Lightning takes it here).
        backend, init_method, timeout, socket_ifname: as for ``ddp``.
    """

    allows_inference_mode = False  # the all-gather buffers made in evaluation are reused by training

    def __init__(
        self,
        auto_wrap_policy: Iterable[type[nn.Module] | str] | None = None,
        sharding_strategy: str = "FULL_SHARD",
        device_mesh: list[int] | tuple[int, int] | None = None,
        state_dict_type: str = "sharded",
        async_save: bool = False,
        cpu_offload: bool = False,
        activation_checkpointing_policy: Iterable[type[nn.Module] | str] | None = None,
        backend: str = "gloo",
        init_method: str = "env://",
        timeout: float = DEFAULT_TIMEOUT_S,
        socket_ifname: str | None = None,
    ) -> None:
        if str(backend).lower() in ("mpi", "fw_mpi"):
            raise ConfigError(
                f"trainer.strategy.backend={backend} with strategy fsdp: not supported (DTensor's collectives, which "
                "FSDP's state dicts and checkpoints use, need a C++ process group; fw's MPI group is a Python one); "
                "under mpiexec use backend gloo: the ranks and the rendezvous come from MPI")
        super().__init__(backend=backend, init_method=init_method, timeout=timeout, socket_ifname=socket_ifname)
        self.name = "fsdp"
        self.wrap_classes = class_names(auto_wrap_policy)
        if str(sharding_strategy).upper() not in SHARDING:
            raise ConfigError(f"trainer.strategy.sharding_strategy: '{sharding_strategy}' is not one fw runs; "
                              f"use {' or '.join(SHARDING)}")
        self.sharding_strategy = str(sharding_strategy).upper()
        self.reshard_after_forward = SHARDING[self.sharding_strategy]
        self.mesh_shape = mesh_shape(device_mesh, self.sharding_strategy)
        if state_dict_type not in ("sharded", "full"):
            raise ConfigError(f"trainer.strategy.state_dict_type: '{state_dict_type}' is not one fw writes; use "
                              "sharded (a folder of every rank's shards) or full (one file, gathered on rank 0)")
        self.state_dict_type = state_dict_type
        if async_save and state_dict_type != "sharded":
            raise ConfigError("trainer.strategy.async_save=true writes sharded checkpoints in the background; it "
                              "needs state_dict_type: sharded (a full checkpoint is gathered on rank 0 first)")
        self.async_save = bool(async_save)
        self.cpu_offload = bool(cpu_offload)
        self.activation_checkpointing_policy = activation_checkpointing_policy  # Lightning's FSDP option
        self.module: TrainModule | None = None
        self._after_call: TrainModule | None = None  # the last call's module: still sharded, its group up
        self._init_rng: torch.Tensor | None = None  # the RNG state trainer.init_module() ended with
        self.pending_save: PendingSave | None = None  # an asynchronous save in flight (async_save.py)
        self.checkpoint_group: Any = None  # the Gloo group asynchronous saves coordinate over
        self.manual: ManualSteps | None = None  # manual optimization's steps (resharding.py)

    def setup_module(self, module: TrainModule) -> nn.Module:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, fully_shard

        trainer = getattr(module, "trainer", None)
        policy = precision_policy(trainer.precision if trainer is not None else "32-true")
        if self.sync_batchnorm:
            raise ConfigError("trainer.sync_batchnorm=true with strategy fsdp: not supported; leave it off "
                              "(BatchNorm statistics then stay per rank) or use strategy ddp")
        shape = (self.world_size,) if self.mesh_shape is None else self._hybrid_shape()
        layout = (shape, self.reshard_after_forward, repr(policy), sorted(self.wrap_classes), self.cpu_offload)
        root = _sharded_before(module, layout)
        if root is None:  # the first call on this module: shard it
            if not has_meta_tensors(module):  # meta tensors are allocated on the device after sharding
                module.to(self.root_device)
            blocks = without_split_ties(module, units(module, self.wrap_classes))
            names = ("replicate", "shard") if len(shape) == 2 else None
            mesh = init_device_mesh(self.root_device.type, shape, mesh_dim_names=names)
            shard = {"mesh": mesh, "reshard_after_forward": self.reshard_after_forward, "mp_policy": policy}
            if self.cpu_offload:  # pinned host memory where there is a device to copy to
                shard["offload_policy"] = CPUOffloadPolicy(pin_memory=self.root_device.type == "cuda")
            for unit in blocks:
                fully_shard(unit, **shard)
            root = StepModule(module)
            keep = None if self.reshard_after_forward else False  # None: the root keeps them for backward (resharding.py)
            fully_shard(root, **{**shard, "reshard_after_forward": keep})
            # a parameter unused on this rank (a routed head) is reduce-scattered as zeros, as DDP's
            # find_unused_parameters does: without it FSDP2 leaves it out of the flat buffer, which then
            # lines up with another rank's different parameters and adds their gradients together
            assert isinstance(root, FSDPModule), "fully_shard makes it one"
            root.set_reduce_scatter_unused_params(True)  # recurses into every unit
            materialize(module, self.root_device, self._init_rng)  # meta-built: shard by shard
            module.__dict__[_SHARDED] = (root, layout)  # not a submodule: the root holds the module
        self.model, self.module = root, module
        return root

    def _hybrid_shape(self) -> tuple[int, int]:
        """``(replicas, shard size)``: as given, or one shard group per node."""
        assert self.mesh_shape is not None, "HYBRID_SHARD only"
        replicas, size = self.mesh_shape
        if replicas == 0:  # not given: shard within a node, replicate across the nodes
            size = self.dist.local_world_size
            replicas = self.world_size // size
        if replicas * size != self.world_size:
            raise ConfigError(f"trainer.strategy.device_mesh=[{replicas}, {size}]: {replicas} x {size} ranks is not the "
                              f"world size {self.world_size}; give two numbers whose product is {self.world_size}")
        return replicas, size

    def compile_units(self, module: nn.Module) -> list[nn.Module]:
        return units(module, self.wrap_classes) if self.wrap_classes else []

    def training_step_fn(self, module: TrainModule) -> Callable[..., Any]:
        from framework.strategies.fsdp.resharding import ManualSteps

        assert self.model is not None, "setup_module() first"
        self.manual = None if module.automatic_optimization else ManualSteps(self.model)
        step = self.step_fn(module, "training_step")
        return step if self.manual is None else self.manual.step(step)

    def manual_backward_fn(self, backward: Callable[..., None]) -> Callable[..., None]:
        return backward if self.manual is None else self.manual.backward(backward)

    def after_manual_step(self) -> None:
        if self.manual is not None:
            self.manual.after_optimizer_step()

    def step_fn(self, module: TrainModule, name: str) -> Callable[..., Any]:
        """The step in the root's forward, which gathers the parameters no smaller unit holds."""
        from framework.strategies.fsdp.resharding import fsdp_modules, resharding

        assert self.model is not None, "setup_module() first"
        return resharding(functools.partial(self.model, step=name), fsdp_modules(self.model))

    def check_optimizers(self, optimizers: list[torch.optim.Optimizer]) -> None:
        from framework.strategies.fsdp.options import only_sharded

        only_sharded(optimizers)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        yield  # gradients are reduce-scattered after every backward: they stay sharded

    def average_gradients(self, params: list[torch.nn.Parameter]) -> None:
        """FSDP's backward already reduced the gradients (manual optimization too)."""

    def teardown(self) -> None:
        """The module stays sharded, and so its process group stays up (until the process
        ends) for the next call on it (``fit`` then ``test``), as under Lightning. After a
        failure both go: the module cannot be used by another call."""
        import torch.distributed as dist

        from framework.strategies.fsdp.async_save import finish_pending

        try:
            finish_pending(self, barrier=not self._failed)  # the call ends with its last checkpoint committed
        finally:
            self._after_call = None if self._failed else self.module  # a save after fit writes it
            if self.module is not None and self._failed:
                self.module.__dict__.pop(_SHARDED, None)
            elif self.module is not None and self._owns_group and dist.is_initialized():
                self._owns_group = False
                destroy_groups_at_exit()
            super().teardown()
            self.module = None

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "sharding": self.sharding_strategy}

    @contextlib.contextmanager
    def tensor_init_context(self, empty_init: bool | None = None) -> Iterator[None]:
        """``trainer.init_module()``: the model is built on the meta device (no memory, no random
        draw) unless ``empty_init=False``; its shards are allocated and initialised after sharding
        from the RNG state at the end of this block, where building it would have drawn."""
        if empty_init is False:
            yield
            return
        with torch.device("meta"), recording_makers():
            yield
        self._init_rng = torch.get_rng_state()

    def model_building_context(self) -> contextlib.AbstractContextManager:
        return recording_makers()  # a tied layer built on meta in configure_model() is initialised by its maker

    # -- checkpoints (full_checkpoint.py) ----------------------------------------------------
    def save_checkpoint(self, path: str, parts: CheckpointParts) -> None:
        """``sharded``: every rank writes its shards into the folder ``path``; ``full``: every
        rank gathers the full state (rank 0 keeps it, on the CPU), rank 0 writes it."""
        from framework.strategies.fsdp import full_checkpoint, sharded_checkpoint

        if self.state_dict_type == "sharded":  # asynchronous within a call only (whose end commits it)
            asynchronous = self.async_save and self.module is not None
            sharded_checkpoint.save_sharded(self, self._sharded_module(), path, parts, asynchronous=asynchronous)
        else:
            full_checkpoint.save_full(self, self._sharded_module(), path, parts)

    def load_checkpoint(self, path: str, parts: CheckpointParts) -> dict[str, Any]:
        """A sharded checkpoint: every rank reads its part of each tensor; one file: every rank
        reads it and shards its full state onto this rank's parameters."""
        from framework.strategies.fsdp import full_checkpoint, sharded_checkpoint

        load = sharded_checkpoint.load_sharded if sharded_checkpoint.is_sharded(path) else full_checkpoint.load_full
        return load(self, self._sharded_module(), path, parts)

    def _sharded_module(self) -> TrainModule:
        """The call's module, or the last call's while its group is up (``save_checkpoint`` after
        ``fit``), holding only its shards (``resharding.py``)."""
        import torch.distributed as dist

        from framework.strategies.fsdp.resharding import reshard_all

        module = self.module if self.module is not None else self._after_call
        if module is None or not dist.is_initialized():
            raise CheckpointError("an FSDP checkpoint is written and read while the run's process group is up "
                                  "(during fit, validate, test or predict, or after one in the same process)")
        kept = module.__dict__.get(_SHARDED)  # fsdp's root; model_parallel's is among the module's own
        reshard_all(kept[0] if kept is not None else module)
        return module


#: where a sharded module keeps its root and the layout it was sharded with
_SHARDED = "_fw_fsdp_root"


def _sharded_before(module: nn.Module, layout: tuple) -> StepModule | None:
    """The root an earlier call sharded ``module`` into, if its layout and group still serve."""
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule

    kept = module.__dict__.get(_SHARDED)
    if kept is not None and kept[1] == layout and dist.is_initialized():
        return kept[0]
    if kept is not None or any(isinstance(m, FSDPModule) for m in module.modules()):
        raise ConfigError(f"{type(module).__name__} was sharded by an earlier fsdp call "
                          + ("with another layout (world size, mesh, sharding, precision or wrap classes)"
                             if kept is not None else "that failed") +
                          ": it cannot be sharded again; use the strategy and devices it was sharded with, or "
                          "build a new model and load its checkpoint")
    return None

