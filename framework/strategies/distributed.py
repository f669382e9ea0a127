"""What DDP over any backend shares: one process per device, the model wrapped in
``DistributedDataParallel``, and the collectives the loop, metrics and callbacks use.

Subclasses say how the default process group is made (``_init_process_group``) and how their
processes are started (``launcher``): ``DDPStrategy`` (Gloo or NCCL, from an init method) in
``ddp/`` and ``MPIStrategy`` (over MPI, under ``mpiexec``) in ``mpi/``.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import functools
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from framework import waiting
from framework.strategies import gather_objects
from framework.strategies.base import StepModule, Strategy
from framework.waiting import waiting_in

if TYPE_CHECKING:
    from framework.environments import ClusterEnvironment
    from framework.module import TrainModule

#: seconds to wait for every rank at start-up and in each collective: long enough for a slow
#: start, short enough that a first run with a missing or stopped rank ends with an error
DEFAULT_TIMEOUT_S = 300.0
#: seconds for Gloo's threads to release the last collectives' work before the group goes
_GLOO_SETTLE_S = 0.03
_REDUCE_OPS = {"sum": "SUM", "mean": "SUM", "avg": "SUM", "max": "MAX", "min": "MIN"}


#: the marks of the collectives below (``framework/waiting.py``), made once: all-reduces run every step
_IN_ALL_REDUCE, _IN_ALL_GATHER = waiting_in("an all-reduce"), waiting_in("an all-gather")


class DistributedStrategy(Strategy):
    """DDP on the default process group, which this strategy creates unless one exists.

    Args:
        timeout: seconds to wait for every rank at start-up and in each collective (default 300;
            raise it when ranks start slowly or a step can take longer).
        find_unused_parameters, bucket_cap_mb, static_graph, gradient_as_bucket_view: passed
            to ``DistributedDataParallel``.
    """

    name = "ddp"
    multi_process = True
    backend = ""

    def __init__(
        self,
        timeout: float = DEFAULT_TIMEOUT_S,
        find_unused_parameters: bool = False,
        bucket_cap_mb: float | None = None,
        static_graph: bool = False,
        gradient_as_bucket_view: bool = False,
    ) -> None:
        super().__init__()
        self.timeout = float(timeout)
        self.ddp_kwargs: dict[str, Any] = {
            "find_unused_parameters": find_unused_parameters,
            "static_graph": static_graph,
            "gradient_as_bucket_view": gradient_as_bucket_view,
        }
        if bucket_cap_mb is not None:
            self.ddp_kwargs["bucket_cap_mb"] = bucket_cap_mb
        self._owns_group = False
        self._excepthooks: tuple = (None, None)
        self._failed = False

    def _needs_launcher(self, environment: ClusterEnvironment, num_nodes: int) -> bool:
        """Whether fw starts this job's processes: not when one process is the whole job, nor
        when a launcher (torchrun, srun, mpiexec) already started them."""
        return not environment.launched_externally and len(self.devices) * num_nodes > 1

    # -- set-up ---------------------------------------------------------------------------
    def setup_environment(self) -> None:
        super().setup_environment()
        _take_a_share_of_the_cores(self.dist.local_world_size)
        if not dist.is_initialized():
            hook_before = sys.excepthook
            self._init_process_group()
            self._owns_group = True
            # torch's init_process_group wraps sys.excepthook (to prefix the rank) for good;
            # put it back with the group, so that the run leaves the process as it found it
            self._excepthooks = (hook_before, sys.excepthook)

    def _init_process_group(self) -> None:
        raise NotImplementedError

    def setup_module(self, module: TrainModule) -> nn.Module:
        if self.sync_batchnorm:
            if self.root_device.type != "cuda":
                from framework.errors import ConfigError

                raise ConfigError("trainer.sync_batchnorm=true needs GPUs (torch's SyncBatchNorm runs on CUDA only); "
                                  "on the CPU leave it off: BatchNorm statistics then stay per rank")
            # swaps the BatchNorm layers inside ``module`` for SyncBatchNorm ones; what it returns
            # is ``module`` itself (it returns another object only for a BatchNorm layer)
            nn.SyncBatchNorm.convert_sync_batchnorm(module)
        module.to(self.root_device)
        device_ids = [self.root_device.index] if self.root_device.type == "cuda" else None
        self.model = nn.parallel.DistributedDataParallel(
            StepModule(module), device_ids=device_ids, **self.ddp_kwargs
        )
        _fix_bucket_layout(self.model)
        return self.model

    def training_step_fn(self, module: TrainModule) -> Callable[..., Any]:
        assert self.model is not None, "setup_module() first"
        return self.model  # DDP's forward prepares the gradient all-reduce, then runs the step

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        assert isinstance(self.model, nn.parallel.DistributedDataParallel), "setup_module() first"
        with self.model.no_sync():
            yield

    def teardown(self) -> None:
        # Drop DDP (its reducer holds the group) before the group goes. After an error there
        # is no barrier: a peer may be gone.
        super().teardown()
        if self._owns_group and dist.is_initialized():
            destroy_process_groups(barrier=not self._failed)
            self._owns_group = False
            before, torch_hook = self._excepthooks
            if sys.excepthook is torch_hook and before is not torch_hook:
                sys.excepthook = before
        self._failed = False

    @property
    def group_outlives_teardown(self) -> bool:
        return not self._owns_group  # a group fw did not make is left as it was found

    def on_exception(self, exc: BaseException) -> None:
        self._failed = True
        if "timed out" in str(exc).lower() and self.world_size > 1:
            waited = waiting.failed_in()
            sys.stderr.write(
                f"fw: rank {self.global_rank} of {self.world_size} waited {self.timeout:g} s for the other ranks "
                f"in {waited or 'a collective'} (trainer.strategy.timeout): a rank stopped "
                "answering or died; its own output says why\n")
        if self.dist.source == "slurm" and self.world_size > 1 and isinstance(exc, Exception):
            atexit.register(_end_slurm_step, self.global_rank)  # after the error is printed


    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "backend": self.backend, "rank": self.global_rank,
                "threads": torch.get_num_threads()}

    def distributed_sampler_kwargs(self) -> dict[str, int] | None:
        return {"num_replicas": self.world_size, "rank": self.global_rank}

    # -- collectives ----------------------------------------------------------------------
    @property
    def collective_device(self) -> torch.device:
        return torch.device("cpu")

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum", group: Any = None) -> torch.Tensor:
        """``op`` over ``group``'s ranks (None: all of them), on a copy."""
        return self.all_reduce_later(tensor, op, group)()

    def all_reduce_later(self, tensor: torch.Tensor, op: str = "sum", group: Any = None
                         ) -> Callable[[], torch.Tensor]:
        """Start ``op`` over ``group``'s ranks (None: all of them), on a copy, without waiting:
        the returned function waits for the result (a collective the ranks reach at different
        moments costs no wait where the result is read later). ``all_reduce`` reads it at once."""
        tensor = tensor.clone()
        work = dist.all_reduce(tensor, op=getattr(dist.ReduceOp, _REDUCE_OPS[op]), group=group, async_op=True)

        def result() -> torch.Tensor:
            with _IN_ALL_REDUCE:
                work.wait()
            if op in ("mean", "avg"):
                return tensor / (self.world_size if group is None else dist.get_world_size(group))
            return tensor

        return result

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        out = [torch.empty_like(tensor) for _ in range(self.world_size)]
        with _IN_ALL_GATHER:
            dist.all_gather(out, tensor.contiguous())
        return torch.stack(out)

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order (``gather_objects``: one collective for a few kB a rank)."""
        with _IN_ALL_GATHER:
            out = gather_objects.all_gather(gather_objects.dumps(obj), self.world_size, self.collective_device)
        return [gather_objects.loads(data) for data in out]

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        box = [obj]
        with waiting_in(f"a broadcast from rank {src}"):
            dist.broadcast_object_list(box, src=src)
        return box[0]

    def barrier(self, name: str | None = None) -> None:
        with waiting_in(f"a barrier ({name})" if name else "a barrier"):
            dist.barrier()

    def average_gradients(self, params: list[nn.Parameter]) -> None:
        """One flat all-reduce per dtype and device, each gradient divided by the world size
        first, as DDP's reducer does. Every rank must pass the same parameters."""
        groups: dict[tuple, list[torch.Tensor]] = {}
        for p in params:
            grad = p.grad
            if grad is None:
                raise ValueError("average_gradients: a parameter has no gradient; pass only those that have one")
            groups.setdefault((grad.dtype, grad.device), []).append(grad)
        for grads in groups.values():
            flat = torch._utils._flatten_dense_tensors(grads).div_(self.world_size)
            dist.all_reduce(flat)
            for grad, averaged in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads), strict=True):
                grad.copy_(averaged)

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        flag = torch.tensor(int(bool(decision)), device=self.collective_device)
        total = int(self.all_reduce(flag, "sum").item())
        return total == self.world_size if all else total > 0


def _end_slurm_step(rank: int) -> None:
    """End this rank's srun step, as torchrun and mpiexec end the job when one process fails:
    srun keeps the other tasks running unless started with ``--kill-on-bad-exit``, and a rank
    that stopped answering would then hold the allocation until its time limit."""
    job, step = os.environ.get("SLURM_JOB_ID"), os.environ.get("SLURM_STEP_ID")
    if not job or step is None:
        return
    sys.stderr.write(f"fw: rank {rank} failed: ending SLURM step {job}.{step} so that no rank is left "
                     "waiting for it (srun --kill-on-bad-exit=1 does the same)\n")
    sys.stderr.flush()
    try:
        subprocess.run(["scancel", "--quiet", "--signal=KILL", f"{job}.{step}"], timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        sys.stderr.write("fw: scancel is not available here; start the job with srun --kill-on-bad-exit=1\n")


def _take_a_share_of_the_cores(local_processes: int) -> None:
    """Each process of a node gets its share of the cores for torch's threads, unless the user
    chose (``OMP_NUM_THREADS``): srun and mpiexec leave every task with all cores' threads, and
    two tasks on two cores then ran 4-40x slower per step than under torchrun. The share is
    ``SLURM_CPUS_PER_TASK`` when SLURM says it, else the cores this process may run on: all of
    them divided among the node's processes, or, when the launcher bound the process to a
    subset (Open MPI binds each rank to a core), that subset."""
    if "OMP_NUM_THREADS" in os.environ or local_processes <= 1:
        return
    if os.environ.get("SLURM_CPUS_PER_TASK", "").isdigit():
        share = int(os.environ["SLURM_CPUS_PER_TASK"])
    else:
        usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        share = usable // local_processes if usable >= (os.cpu_count() or 1) else usable
    torch.set_num_threads(max(1, share))


@functools.cache
def destroy_groups_at_exit() -> None:
    """At exit a group kept up after its call (``fsdp``) goes as a group goes after DDP (a barrier,
    then a moment for Gloo's threads; seen aborting 1 exit in about 10 without them); a peer that
    is gone is not waited for more than 30 s."""
    atexit.register(lambda: destroy_process_groups(timeout=30.0) if dist.is_initialized() else None)


def _fix_bucket_layout(model: nn.parallel.DistributedDataParallel) -> None:
    """Give DDP its final gradient buckets now, before the first step, so that every run lays
    out the gradients the same way at every step (collective on the model's group).

    Left alone, DDP reduces its first iteration in one bucket in parameter order and then
    rebuilds the buckets in the order the gradients became ready. An all-reduce over 3 or more
    ranks (measured with Gloo) adds an element's per-rank values in an order that depends on where the
    element sits in its bucket, so a run resumed from a checkpoint, whose first iteration is
    the uninterrupted run's step k, summed that step in another order: a few weights ended a
    float32 ulp apart on 4 ranks. Here the buckets are rebuilt once, in parameter order (what
    DDP's Join hook does for a rank that ran out of data), and DDP rebuilds nothing later.
    Cost: the bucket of the first layers' gradients, ready last, goes first, so every bucket is
    all-reduced after the backward pass instead of overlapping its end (a 48 MB MLP: 0 of 3
    buckets sent before the last gradient was ready, 2 of 3 without this). So only where the
    order can matter: 2 ranks add a + b, the same as b + a. ``find_unused_parameters=True``
    never rebuilds (its buckets stay in reversed parameter order, which overlaps): there this
    does nothing.
    """
    if dist.get_world_size(model.process_group) > 2:
        model.reducer._push_all_rebuilt_params()
        model.reducer._rebuild_buckets()


def destroy_process_groups(barrier: bool = True, group: Any = None, timeout: float | None = None) -> None:
    """Destroy every process group of this process, the way that does not abort it on exit.

    With ``barrier``, every rank first finishes its last collective (a barrier on ``group``, the
    default one unless given), then Gloo's worker threads get a moment to drop the work objects
    (and tensors) of those last collectives. A thread that drops them while the interpreter
    shuts down aborts the process ("terminate called without an active exception"): 1 run in 10
    here without the wait, 0 in 40 with it. Without ``barrier`` (after an error: a peer may be
    gone) the groups go at once. With ``timeout`` (seconds; Gloo's monitored barrier), a peer
    that does not come is not waited for longer: the groups go at once.
    """
    if barrier:
        try:
            if timeout is not None and dist.get_backend(group) == "gloo":
                dist.monitored_barrier(group=group, timeout=datetime.timedelta(seconds=timeout))
            else:
                dist.barrier(group=group)
            time.sleep(_GLOO_SETTLE_S)
        except RuntimeError:
            if timeout is None:
                raise
    dist.destroy_process_group()
