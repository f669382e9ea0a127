"""``model_parallel`` (Lightning's ``ModelParallelStrategy``): a 2-D ``DeviceMesh`` of data-parallel
× tensor-parallel ranks, handed to the module's ``configure_model`` as ``self.device_mesh``
(dimensions ``"data_parallel"`` and ``"tensor_parallel"``), where the module applies
``parallelize_module`` and ``fully_shard`` itself, or in one line with ``fw.parallel.parallelize``.

Rank r sits at ``(r // tensor_parallel_size, r % tensor_parallel_size)``: the ranks of one
tensor-parallel group are neighbours (on one node, where their many collectives are fastest). The
data are sharded over the data-parallel dimension only: the ranks of a tensor-parallel group read
the same batches, and a mid-epoch position carries over to another mesh in samples of fw's global
order as under DDP. Values logged with ``sync_dist=True`` and torchmetrics metrics are reduced over
the data-parallel dimension (each tensor-parallel group holds one copy of a batch's result).

What fw checks, because each would train silently wrong: ``configure_model`` must be overridden; with
more than one data-parallel rank some module must be sharded with ``fully_shard`` (else the replicas'
gradients would never be averaged); with more than one tensor-parallel rank some parameter must be
split over that dimension, and after the first optimizer step the parameters left whole (plain
tensors, the same on every tensor-parallel rank) are compared across the group. Checkpoints are the
``fsdp`` strategy's: a sharded folder (``save_distributed_checkpoint=True``) or one gathered file;
either resumes on another mesh, under ``fsdp``, DDP or in one process.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from framework.errors import ConfigError, TrainingError
from framework.strategies.base import inside
from framework.strategies.distributed import DEFAULT_TIMEOUT_S
from framework.strategies.fsdp import FSDPStrategy

if TYPE_CHECKING:
    from framework.module import TrainModule

MESH_DIMS = ("data_parallel", "tensor_parallel")


class ModelParallelStrategy(FSDPStrategy):
    """Data parallel × tensor parallel over Gloo (CPU) or NCCL (CUDA), one process per device.

    Args:
        data_parallel_size: replicas (FSDP shards over them); ``"auto"``: the number of nodes.
        tensor_parallel_size: ranks that split each layer; ``"auto"``: the devices of one node.
        save_distributed_checkpoint: a sharded folder every rank writes its shards into (``True``)
            or one file gathered on rank 0 (``False``).
        async_save: write sharded checkpoints while training goes on.
        activation_checkpointing_policy: as the Trainer's.
        process_group_backend: Lightning's name for ``backend``.
        backend, init_method, timeout, socket_ifname: as for ``ddp``.
    """

    def __init__(
        self,
        data_parallel_size: int | str = "auto",
        tensor_parallel_size: int | str = "auto",
        save_distributed_checkpoint: bool = True,
        async_save: bool = False,
        activation_checkpointing_policy: Any = None,
        process_group_backend: str | None = None,
        backend: str = "gloo",
        init_method: str = "env://",
        timeout: float = DEFAULT_TIMEOUT_S,
        socket_ifname: str | None = None,
    ) -> None:
        super().__init__(state_dict_type="sharded" if save_distributed_checkpoint else "full", async_save=async_save,
                         activation_checkpointing_policy=activation_checkpointing_policy,
                         backend=process_group_backend or backend, init_method=init_method, timeout=timeout,
                         socket_ifname=socket_ifname)
        self.name = "model_parallel"
        self.sizes = (_size(data_parallel_size, "data_parallel_size"), _size(tensor_parallel_size, "tensor_parallel_size"))
        self.device_mesh = None  # built at set-up, kept for the next call on the same module
        self._loss_parallel = False

    # -- set-up -----------------------------------------------------------------------------
    def setup_environment(self) -> None:
        super().setup_environment()
        shape = self.mesh_shape_now()
        if self.device_mesh is None or tuple(self.device_mesh.shape) != shape:
            from torch.distributed.device_mesh import init_device_mesh

            self.device_mesh = init_device_mesh(self.root_device.type, shape, mesh_dim_names=MESH_DIMS)

    def check(self, devices: Any, num_devices: int, num_nodes: int, environment: Any) -> None:
        super().check(devices, num_devices, num_nodes, environment)
        mesh_shape(self.sizes, num_devices * num_nodes, num_devices)  # refused when the Trainer is built

    def mesh_shape_now(self) -> tuple[int, int]:
        return mesh_shape(self.sizes, self.world_size, self.dist.local_world_size)

    def setup_module(self, module: TrainModule) -> nn.Module:
        from framework.module import TrainModule
        from framework.parallel import LOSS_PARALLEL
        from framework.strategies.fsdp.materialize import materialize

        # overridden by its class, or held by the module itself (as the hook dispatcher reads a hook)
        if type(module).configure_model is TrainModule.configure_model and "configure_model" not in vars(module):
            raise ConfigError(f"strategy model_parallel: {type(module).__name__} does not override configure_model(), "
                              "where the model is parallelized over self.device_mesh; add it (one line: "
                              "fw.parallel.parallelize(self.model, self.device_mesh, blocks={Block})), or use "
                              "strategy fsdp")
        if self.sync_batchnorm:
            raise ConfigError("trainer.sync_batchnorm=true with strategy model_parallel: not supported; leave it off")
        self._refuse_what_would_not_be_parallel(module)
        materialize(module, self.root_device, self._init_rng)
        module.to(self.root_device)  # what configure_model left whole
        self._loss_parallel = any(m.__dict__.get(LOSS_PARALLEL) for m in module.modules())
        self._reduce_metrics_over_data(module)
        self.model, self.module = module, module
        return module

    def _refuse_what_would_not_be_parallel(self, module: nn.Module) -> None:
        from torch.distributed.fsdp import FSDPModule
        from torch.distributed.tensor import DTensor

        dp, tp = self.device_mesh.shape
        name = type(module).__name__
        if dp > 1 and not any(isinstance(m, FSDPModule) for m in module.modules()):
            raise ConfigError(f"strategy model_parallel: data_parallel_size={dp} and {name}.configure_model() shards "
                              "nothing with fully_shard(..., mesh=self.device_mesh['data_parallel']): the replicas' "
                              "gradients would never be averaged. Shard the model there (fw.parallel.parallelize does)")
        tp_mesh = self.device_mesh["tensor_parallel"]
        if tp > 1 and not any(isinstance(p, DTensor) and _on(p, tp_mesh) for p in module.parameters()):
            raise ConfigError(f"strategy model_parallel: tensor_parallel_size={tp} and {name}.configure_model() splits "
                              "no parameter over self.device_mesh['tensor_parallel'] (parallelize_module): every "
                              "tensor-parallel rank would compute the same thing. Split the blocks there, or set "
                              "tensor_parallel_size=1")

    def _reduce_metrics_over_data(self, module: nn.Module) -> None:
        """torchmetrics metrics sync over the data-parallel dimension: a tensor-parallel group's
        ranks hold one copy of their batches' state, which a sync over all ranks would add up
        ``tensor_parallel_size`` times (a sum, a count of samples)."""
        import sys

        torchmetrics = sys.modules.get("torchmetrics")
        if torchmetrics is None or self.device_mesh.shape[1] == 1:
            return
        group = self.device_mesh["data_parallel"].get_group()
        for m in module.modules():
            if isinstance(m, torchmetrics.Metric):
                m.process_group = group

    # -- steps --------------------------------------------------------------------------------
    def compile_units(self, module: nn.Module) -> list[nn.Module]:
        from framework.parallel import BLOCK

        return [m for m in module.modules() if m.__dict__.get(BLOCK)]

    def training_step_fn(self, module: TrainModule) -> Callable[..., Any]:
        from framework.strategies.fsdp.resharding import fsdp_modules, resharding

        step = module.training_step
        if self._loss_parallel and not module.automatic_optimization:  # automatic: the loop runs step and
            step = inside(self.step_context, step)  # backward inside step_context(); manual: the step does
        return resharding(step, fsdp_modules(module))  # a root gathered by a step without backward reshards

    def step_fn(self, module: TrainModule, name: str) -> Callable[..., Any]:
        from framework.strategies.fsdp.resharding import fsdp_modules, resharding

        step = getattr(module, name)
        return resharding(inside(self.step_context, step) if self._loss_parallel else step, fsdp_modules(module))

    def step_context(self) -> contextlib.AbstractContextManager | None:
        """``loss_parallel`` when the head is split by vocabulary (``fw.parallel``): the loss of
        sharded logits and its backward are computed shard by shard."""
        if not self._loss_parallel:
            return None
        from torch.distributed.tensor.parallel import loss_parallel

        return loss_parallel()

    def check_optimizers(self, optimizers: list[torch.optim.Optimizer]) -> None:
        assert self.module is not None, "setup_module() first"
        mine = {id(p) for p in self.module.parameters()}
        for i, optimizer in enumerate(optimizers):
            stale = [p for group in optimizer.param_groups for p in group["params"] if id(p) not in mine]
            if stale:
                raise ConfigError(
                    f"optimizer {i} ({type(optimizer).__name__}) holds {len(stale)} parameter(s) that are not the "
                    "model's after configure_model() parallelized it (built before, e.g. in __init__): it would step "
                    "tensors the model no longer uses. Build it in configure_optimizers() from self.parameters()")
        if self.device_mesh.shape[1] > 1:
            for optimizer in optimizers:
                _check_whole_parameters_after_first_step(self, optimizer)

    # -- collectives over the data ------------------------------------------------------------
    def distributed_sampler_kwargs(self) -> dict[str, int] | None:
        dp, tp = self.device_mesh.shape if self.device_mesh is not None else self.mesh_shape_now()
        return {"num_replicas": dp, "rank": self.global_rank // tp}

    def all_reduce_over_data(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        return self.all_reduce(tensor, op, group=self.device_mesh["data_parallel"].get_group())

    def describe(self) -> dict[str, Any]:
        dp, tp = self.device_mesh.shape if self.device_mesh is not None else self.mesh_shape_now()
        return {**super().describe(), "sharding": f"{dp} data parallel x {tp} tensor parallel"}


def mesh_shape(sizes: tuple[int | None, int | None], world: int, per_node: int) -> tuple[int, int]:
    """``(data parallel, tensor parallel)`` for ``world`` ranks: as given, or filled in (``auto``:
    tensor parallel within a node, data parallel across the nodes, as in Lightning)."""
    dp, tp = sizes
    if dp is None and tp is None:
        tp = per_node
    if dp is None or tp is None:
        given, key = (tp, "tensor_parallel_size") if dp is None else (dp, "data_parallel_size")
        assert given is not None
        if world % given:
            raise ConfigError(f"trainer.strategy.{key}={given} does not divide the world of {world} ranks "
                              f"(devices x num_nodes); give a divisor of {world}")
        dp, tp = (world // given, given) if dp is None else (given, world // given)
    if dp * tp != world:
        raise ConfigError(f"trainer.strategy: data_parallel_size={dp} x tensor_parallel_size={tp} is {dp * tp} "
                          f"ranks, the world is {world} (devices x num_nodes); give sizes whose product is {world}, "
                          "or 'auto'")
    return dp, tp


def _size(value: int | str, key: str) -> int | None:
    if value == "auto":
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    raise ConfigError(f"trainer.strategy.{key}={value!r}: give a positive whole number or 'auto'")


def _on(param: Any, mesh: Any) -> bool:
    """Is the DTensor ``param`` split over ``mesh`` (one dimension of the strategy's mesh)?"""
    from torch.distributed.tensor import Shard

    names = param.device_mesh.mesh_dim_names or ()
    return any(name in (mesh.mesh_dim_names or ()) and isinstance(placement, Shard)
               for name, placement in zip(names, param.placements, strict=False))


def _check_whole_parameters_after_first_step(strategy: ModelParallelStrategy, optimizer: torch.optim.Optimizer) -> None:
    """After the optimizer's first step, its parameters that no layer split (plain tensors) must
    be equal on the ranks of a tensor-parallel group: a layer that sees only this rank's part of
    an activation (a norm after a sequence split, say) gets other gradients on each rank, and the
    copies would drift apart without an error."""
    from torch.distributed.tensor import DTensor

    from framework.optim import after_first_step

    names = {id(p): n for n, p in strategy.module.named_parameters()} if strategy.module is not None else {}
    whole = [p for group in optimizer.param_groups for p in group["params"] if not isinstance(p, DTensor)]
    if not whole:
        return
    group = strategy.device_mesh["tensor_parallel"].get_group()

    def check() -> None:
        sums = torch.stack([p.detach().double().sum() for p in whole]).to(strategy.collective_device)
        low, high = (strategy.all_reduce(sums, op, group=group) for op in ("min", "max"))
        apart = [names.get(id(p), "?") for p, lo, hi in zip(whole, low, high, strict=True) if lo != hi]
        if apart:
            raise TrainingError(
                f"strategy model_parallel: after the first step the parameter(s) {', '.join(apart[:5])} differ between "
                "the ranks of a tensor-parallel group: they are left whole but see other activations on each rank "
                "(e.g. a norm after a sequence-parallel split). Split them too (SequenceParallel; "
                "fw.parallel.parallelize(sequence_parallel=True) splits a block's children of a class named ...Norm)")

    after_first_step(optimizer, check)
