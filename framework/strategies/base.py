"""The strategy: how processes cooperate. One abstract class, small concrete subclasses.

A strategy owns the process group (if any), wraps the model (DDP, DataParallel), and offers the
collectives the loop, metrics and callbacks use. Every collective here must be called on every
rank; none may sit inside a rank-zero-only branch.
"""

from __future__ import annotations

import contextlib
import zlib
from abc import ABC
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from framework.accelerators import Accelerator
from framework.environments import ClusterEnvironment, DistInfo
from framework.errors import ConfigError

if TYPE_CHECKING:
    from framework.checkpointing.parts import CheckpointParts
    from framework.module import TrainModule
    from framework.strategies.ft.replicas import Replicas
    from framework.strategies.launchers import Launcher


def inside(context: Callable[[], Any], fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` run inside a fresh ``context()`` at each call (``Strategy.step_context``, where not None)."""
    def run(*args: Any, **kwargs: Any) -> Any:
        with context():
            return fn(*args, **kwargs)

    return run


class StepModule(nn.Module):
    """Routes ``forward`` to ``training_step`` (or the step ``step`` names) so that wrappers (DDP,
    DataParallel, FSDP), which only intercept ``forward``, see the step: DDP synchronises its
    gradients, FSDP gathers the parameters it shards."""

    def __init__(self, module: TrainModule) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args: Any, step: str = "training_step", **kwargs: Any) -> Any:
        return getattr(self.module, step)(*args, **kwargs)


class Strategy(ABC):
    """One process per job and no communication; subclasses add processes and wrappers.

    Lifecycle, driven by the Trainer: ``check(...)`` (refuse what it cannot run) ->
    ``connect(accelerator, dist, devices)`` -> ``launcher(...)`` (how its processes start) ->
    per run: ``setup_environment()`` (process group, device) -> ``setup_module(module)`` ->
    ``training_step_fn(module)(batch, batch_idx)`` per batch -> ``teardown()``.
    """

    name = ""
    #: Does this strategy run one process per device (and so need a launcher)?
    multi_process = False

    def __init__(self) -> None:
        self.accelerator: Accelerator | None = None
        self.dist = DistInfo()
        self.devices: list[int] = [0]
        self.root_device = torch.device("cpu")
        self.model: nn.Module | None = None
        #: set by the Trainer (``trainer.sync_batchnorm``): DDP then converts BatchNorm layers to SyncBatchNorm
        self.sync_batchnorm = False

    # -- decisions made when the Trainer is built ------------------------------------------
    accelerator_name = "cpu"  # set by create_strategy: the accelerator the strategy will run on

    def check(self, devices: Any, num_devices: int, num_nodes: int, environment: ClusterEnvironment) -> None:
        """Refuse a job this strategy cannot run, saying how to fix it.

        Args:
            devices: ``trainer.devices`` as given (for messages).
            num_devices: devices per node that the run uses.
            num_nodes: ``trainer.num_nodes``.
            environment: the launcher environment this process runs under.
        """
        if self.multi_process:
            environment.check(num_devices, num_nodes)
            return
        if num_nodes > 1:
            raise ConfigError(f"trainer.num_nodes={num_nodes} needs a multi-process strategy (ddp, mpi)")
        if not environment.launched_externally:  # one process here: the job (a Kubeflow job's pods) must be one too
            environment.check(1, 1)
        launched = environment.info() if environment.launched_externally else None
        if launched is not None and launched.world_size > 1:
            raise ConfigError(
                f"{launched.source} started {launched.world_size} processes but trainer.strategy="
                f"{self.name} runs in one: each would train alone. Set trainer.strategy=ddp "
                f"(or mpi under mpiexec) and trainer.devices={launched.local_world_size}"
            )

    def launcher(self, environment: ClusterEnvironment, num_nodes: int, max_restarts: int,
                 rdzv_endpoint: str | None) -> Launcher | None:
        """How this strategy's processes are started: a ``Launcher`` that fw runs before the
        first stage (see ``framework/strategies/launchers/``), or None when this process is
        the whole job or a launcher already started the workers."""
        return None

    # -- set-up ---------------------------------------------------------------------------
    def connect(self, accelerator: Accelerator, dist: DistInfo, devices: list[int]) -> None:
        self.accelerator, self.dist, self.devices = accelerator, dist, devices
        local_index = devices[dist.local_rank] if self.multi_process else devices[0]
        self.root_device = accelerator.device_for(local_index)

    def setup_environment(self) -> None:
        assert self.accelerator is not None, "connect() first"
        self.accelerator.setup_device(self.root_device)

    def setup_module(self, module: TrainModule) -> nn.Module:
        """Move the module to the device; return the model that runs training steps."""
        module.to(self.root_device)
        self.model = module
        return module

    def training_step_fn(self, module: TrainModule) -> Callable[..., Any]:
        """What the loop calls with ``(batch, batch_idx)``: the module's step, or the wrapper
        (DDP, DataParallel) whose forward runs it. Looked up once per epoch, not per batch."""
        return module.training_step

    def step_fn(self, module: TrainModule, name: str) -> Callable[..., Any]:
        """What an evaluation or predict loop calls for the step ``name`` (``validation_step``,
        ``test_step``, ``predict_step``): the module's own method, except where the parameters
        exist only inside a wrapper's forward (FSDP)."""
        return getattr(module, name)

    #: May evaluation run under ``torch.inference_mode`` (``trainer.inference_mode``)? Not under
    #: FSDP, whose buffers made there could not be written by the training steps after it
    #: (Lightning switches to ``no_grad`` there too).
    allows_inference_mode = True
    #: the mesh ``model_parallel`` hands to ``configure_model`` (``TrainModule.device_mesh``); None elsewhere
    device_mesh: Any = None
    #: the strategy's own ``activation_checkpointing_policy`` (``fsdp``, ``model_parallel``; Lightning's place)
    activation_checkpointing_policy: Any = None

    def compile_units(self, module: nn.Module) -> list[nn.Module]:
        """The blocks ``trainer.compile`` compiles one by one (those a strategy shards), or none:
        then the module as a whole."""
        return []

    def step_context(self) -> contextlib.AbstractContextManager | None:
        """What a training step and its backward run inside (``model_parallel``'s loss parallel),
        or None."""
        return None

    def no_grad(self, inference_mode: bool) -> contextlib.AbstractContextManager:
        """The context evaluation and predict run in: ``inference_mode`` where allowed, else ``no_grad``."""
        return torch.inference_mode() if inference_mode and self.allows_inference_mode else torch.no_grad()

    def check_optimizers(self, optimizers: list[torch.optim.Optimizer]) -> None:
        """Refuse optimizers this strategy cannot train with (FSDP: over unsharded parameters)."""

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Skip gradient synchronisation (accumulation steps); nothing to skip here."""
        yield

    def teardown(self) -> None:
        self.model = None

    @property
    def group_outlives_teardown(self) -> bool:
        """Is the job's process group still up after this call's teardown (so that a
        ``save_checkpoint`` after the fit can gather every rank's states then)?"""
        return False

    def describe(self) -> dict[str, Any]:
        return {"strategy": self.name, "world_size": self.world_size, "device": str(self.root_device)}

    # -- where this process stands --------------------------------------------------------
    @property
    def global_rank(self) -> int:
        return self.dist.rank

    @property
    def local_rank(self) -> int:
        return self.dist.local_rank

    @property
    def world_size(self) -> int:
        return self.dist.world_size

    @property
    def is_global_zero(self) -> bool:
        return self.global_rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    def tensor_init_context(self, empty_init: bool | None = None) -> contextlib.AbstractContextManager:
        """``trainer.init_module()``: where tensors made inside go (here: where they would; a
        strategy that shards builds on the meta device). ``empty_init`` is a hint it may ignore."""
        return contextlib.nullcontext()

    def model_building_context(self) -> contextlib.AbstractContextManager:
        """Around the module's ``configure_model()``: what a strategy notes while layers are built."""
        return contextlib.nullcontext()

    def distributed_sampler_kwargs(self) -> dict[str, int] | None:
        """``num_replicas`` and ``rank`` for samplers, or None when data need no sharding."""
        return None

    def evaluation_sampler_kwargs(self) -> dict[str, int] | None:
        """The shard of the evaluation loaders: the training data's, except where replica groups
        each evaluate on their own (``ft``)."""
        return self.distributed_sampler_kwargs()

    #: a fault-tolerant run's replica groups (``ft``: ``strategies/ft/replicas.py``), whose quorum
    #: and commit the training step calls; None elsewhere
    replicas: Replicas | None = None

    def join_replicas(self, save: Callable[[], dict], load_in_place: Callable[[dict], None], global_step: int,
                      manual: bool, on_nonfinite: str, facts: Callable[[], dict[str, float]] = dict,
                      folders: Callable[[], list[str]] = list) -> str | None:
        """Meet the other replica groups of a fault-tolerant run at the start of a fit: what to
        restore from when a live peer sent its state (``load_checkpoint`` reads it); None here."""
        return None

    @property
    def data_parallel_size(self) -> int:
        """The ranks that read data of their own (``num_replicas`` of the samplers)."""
        shard = self.distributed_sampler_kwargs()
        return shard["num_replicas"] if shard else 1

    @property
    def data_parallel_rank(self) -> int:
        shard = self.distributed_sampler_kwargs()
        return shard["rank"] if shard else 0

    # -- collectives (identity without a process group) ----------------------------------
    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        return tensor

    def all_reduce_later(self, tensor: torch.Tensor, op: str = "sum") -> Callable[[], torch.Tensor]:
        """Start ``all_reduce`` of ``tensor`` and go on: returns what waits for the result."""
        result = self.all_reduce(tensor, op)
        return lambda: result

    def all_reduce_over_data(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """``all_reduce`` over the ranks that read other data (all of them, except where ranks
        split a model between them: ``model_parallel``), for logged values and metrics."""
        return self.all_reduce(tensor, op)

    def the_same_on_every_rank(self, text: str) -> bool:
        """Do all ranks hold the same ``text``? One small all-reduce of two checksums of it (the
        largest and the smallest over the ranks agree), not a gather."""
        data = text.encode()
        sums = [float(zlib.crc32(data)), float(zlib.adler32(data))]
        both = self.all_reduce(torch.tensor(sums + [-x for x in sums], dtype=torch.float64,
                                            device=self.collective_device), "max").tolist()
        return both[0] == -both[2] and both[1] == -both[3]

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Stack ``tensor`` from every rank along a new first dimension."""
        return tensor.unsqueeze(0)

    def all_gather_object(self, obj: Any) -> list[Any]:
        return [obj]

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        return obj

    def barrier(self, name: str | None = None) -> None:
        return None

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        return bool(decision)

    def average_gradients(self, params: list[torch.nn.Parameter]) -> None:
        """Average the gradients of ``params`` over the ranks, in place (manual optimization,
        where DDP's reducer is not used); nothing to do in one process."""

    def manual_backward_fn(self, backward: Callable[..., None]) -> Callable[..., None]:
        """How ``manual_backward`` runs ``backward(loss, ...)``: as it is, but under ``fsdp``."""
        return backward

    def after_manual_step(self) -> None:
        """After an ``optimizer.step()`` in manual optimization: nothing to do, but under ``fsdp``."""

    @property
    def collective_device(self) -> torch.device:
        """Where tensors handed to collectives must live (NCCL: the GPU; Gloo/MPI: the CPU)."""
        return self.root_device

    # -- checkpoints (``framework/checkpointing/parts.py``) -----------------------------
    def save_checkpoint(self, path: str, parts: CheckpointParts) -> None:
        """Write ``parts`` to ``path``; call on every rank. Here: rank 0 writes one file, with
        every rank's per-rank parts (``checkpointing/single_file.py``)."""
        from framework.checkpointing.single_file import save_from_rank_zero

        save_from_rank_zero(self, path, parts)

    def load_checkpoint(self, path: str, parts: CheckpointParts) -> dict[str, Any]:
        """Load ``parts`` from ``path`` on every rank; the checkpoint's contents."""
        from framework.checkpointing.single_file import load_on_every_rank

        return load_on_every_rank(self, path, parts)

    def on_exception(self, exc: BaseException) -> None:
        """Called on the failing rank before the error propagates (MPI aborts the job here)."""
