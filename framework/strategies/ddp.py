"""DistributedDataParallel over Gloo or NCCL: one process per device.

``ddp_gloo`` and ``ddp_nccl`` are this one class with another ``backend``. The process group is
set up from the detected cluster environment (rank, world size, master address) with the init
method the recipe names: ``env://`` (default), ``tcp://host:port`` or ``file:///path``.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import os
import re
import socket
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlparse

import torch
import torch.distributed as dist
from torch import nn

from framework.errors import ConfigError, DistributedSetupError, did_you_mean
from framework.strategies.base import StepModule, Strategy

_REDUCE_OPS = {"sum": "SUM", "mean": "SUM", "avg": "SUM", "max": "MAX", "min": "MIN"}


class DDPStrategy(Strategy):
    """DDP with ``backend`` in {gloo, nccl}; options as in the recipe's strategy mapping.

    Args:
        backend: ``gloo`` or ``nccl``.
        init_method: ``env://``, ``tcp://host:port`` or ``file:///path``.
        timeout: seconds to wait for every rank at start-up and in each collective.
        socket_ifname: network interface for Gloo/NCCL traffic (sets GLOO_SOCKET_IFNAME or
            NCCL_SOCKET_IFNAME after checking that it exists on this host).
        find_unused_parameters, bucket_cap_mb, static_graph, gradient_as_bucket_view: passed
            to ``DistributedDataParallel``.
    """

    name = "ddp"
    multi_process = True
    #: process groups this process initialised on an agent's store (see ``_elastic_store``)
    _store_inits = 0

    def __init__(
        self,
        backend: str = "gloo",
        init_method: str = "env://",
        timeout: float = 1800,
        socket_ifname: str | None = None,
        find_unused_parameters: bool = False,
        bucket_cap_mb: float | None = None,
        static_graph: bool = False,
        gradient_as_bucket_view: bool = False,
    ) -> None:
        super().__init__()
        if backend not in ("gloo", "nccl"):
            raise ConfigError(f"trainer.strategy.backend: unknown backend '{backend}'; use gloo or nccl")
        self.backend = backend
        self.name = f"ddp_{backend}"
        self.init_method = str(init_method)
        self.timeout = float(timeout)
        self.socket_ifname = socket_ifname
        self.ddp_kwargs: dict[str, Any] = {
            "find_unused_parameters": find_unused_parameters,
            "static_graph": static_graph,
            "gradient_as_bucket_view": gradient_as_bucket_view,
        }
        if bucket_cap_mb is not None:
            self.ddp_kwargs["bucket_cap_mb"] = bucket_cap_mb
        _check_init_method(self.init_method)
        if socket_ifname:
            _check_interface(socket_ifname, backend)  # here, before any worker is started
        self._owns_group = False

    # -- set-up ---------------------------------------------------------------------------
    def setup_environment(self) -> None:
        super().setup_environment()
        if self.socket_ifname:
            os.environ["NCCL_SOCKET_IFNAME" if self.backend == "nccl" else "GLOO_SOCKET_IFNAME"] = (
                self.socket_ifname
            )
        if not dist.is_initialized():
            self._init_process_group()
            self._owns_group = True

    def _init_process_group(self) -> None:
        info = self.dist
        if self.init_method.startswith("env://"):
            # torchrun sets these; under SLURM or MPI they come from the detected environment
            os.environ.setdefault("MASTER_ADDR", info.master_addr)
            if info.master_port is not None:
                os.environ.setdefault("MASTER_PORT", str(info.master_port))
            elif info.world_size == 1:  # a world of one needs a port only to talk to itself
                from framework.launch import free_port

                os.environ.setdefault("MASTER_PORT", str(free_port()))
            if "MASTER_PORT" not in os.environ:
                raise DistributedSetupError(
                    "init_method env:// needs MASTER_PORT; set it (e.g. export MASTER_PORT=29500) "
                    "or name one with trainer.strategy.init_method=tcp://HOST:PORT"
                )
        timeout = datetime.timedelta(seconds=self.timeout)
        try:
            store = self._elastic_store(timeout)
            rendezvous = {"store": store} if store is not None else {"init_method": self.init_method}
            dist.init_process_group(
                self.backend, world_size=info.world_size, rank=info.rank, timeout=timeout, **rendezvous
            )
        except (dist.DistError, RuntimeError, ValueError) as err:
            raise _explain_init_failure(err, self) from None

    def _elastic_store(self, timeout: datetime.timedelta) -> dist.Store | None:
        """Under torchrun or fw's own launcher, the store to rendezvous on (else None: torch's).

        There torch takes every ``env://`` or ``tcp://`` endpoint for the elastic agent's store
        (``TORCHELASTIC_USE_AGENT_STORE``), and fw builds the store itself for two reasons:

        - a ``tcp://`` port other than the agent's would have every rank connect as a client
          with nobody listening, a hang until the timeout; rank 0 hosts that store here;
        - the agent's store outlives a process group, and torch restarts its group numbering
          when a group is destroyed, so a second ``init_process_group`` in the same worker
          (``fit`` then ``test``) would read the first one's keys and hang; each init gets its
          own key prefix.
        """
        if self.init_method.startswith("file://") or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
            return None
        if self.init_method.startswith("tcp://"):
            url = urlparse(self.init_method)
            host, port = url.hostname, url.port
        else:
            host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        hosted_here = str(port) != os.environ.get("MASTER_PORT") and self.dist.rank == 0
        store = dist.TCPStore(host, port, self.dist.world_size, is_master=hosted_here,
                              timeout=timeout, multi_tenant=True)
        # every rank initialises the same number of times, so the counters agree
        DDPStrategy._store_inits += 1
        return dist.PrefixStore(f"fw/init_{DDPStrategy._store_inits}", store)

    def setup_module(self, module: nn.Module) -> nn.Module:
        module.to(self.root_device)
        device_ids = [self.root_device.index] if self.root_device.type == "cuda" else None
        self.model = nn.parallel.DistributedDataParallel(
            StepModule(module), device_ids=device_ids, **self.ddp_kwargs
        )
        return self.model

    def training_step_fn(self, module: nn.Module):
        return self.model  # DDP's forward prepares the gradient all-reduce, then runs the step

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        with self.model.no_sync():
            yield

    def teardown(self) -> None:
        # Drop DDP (its reducer holds the group) before the group goes: a reducer that outlives
        # its Gloo group aborts the process at exit ("terminate called without an active
        # exception") in about 3 runs of 10 with torch 2.13.
        super().teardown()
        gc.collect()
        if self._owns_group and dist.is_initialized():
            dist.destroy_process_group()
            self._owns_group = False

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "backend": self.backend,
            "init_method": self.init_method,
            "rank": self.global_rank,
        }

    def distributed_sampler_kwargs(self) -> dict[str, int] | None:
        return {"num_replicas": self.world_size, "rank": self.global_rank}

    # -- collectives ----------------------------------------------------------------------
    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        tensor = tensor.clone()
        dist.all_reduce(tensor, op=getattr(dist.ReduceOp, _REDUCE_OPS[op]))
        if op in ("mean", "avg"):
            tensor = tensor / self.world_size
        return tensor

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        out = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(out, tensor.contiguous())
        return torch.stack(out)

    def all_gather_object(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]

    def barrier(self, name: str | None = None) -> None:
        if self.backend == "nccl":
            dist.barrier(device_ids=[self.root_device.index])
        else:
            dist.barrier()

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        flag = torch.tensor(int(bool(decision)), device=self._collective_device())
        total = int(self.all_reduce(flag, "sum").item())
        return total == self.world_size if all else total > 0

    def _collective_device(self) -> torch.device:
        return self.root_device if self.backend == "nccl" else torch.device("cpu")


def _check_init_method(init_method: str) -> None:
    if init_method.startswith("env://"):
        return
    if init_method.startswith("tcp://"):
        if not re.fullmatch(r"tcp://[^:/]+:\d+/?", init_method):
            raise ConfigError(
                f"trainer.strategy.init_method '{init_method}' must look like tcp://HOST:PORT"
            )
        return
    if init_method.startswith("file://"):
        path = Path(init_method[len("file://") :])
        if not path.parent.is_dir():
            raise ConfigError(
                f"trainer.strategy.init_method '{init_method}': directory {path.parent} does not "
                "exist; create it (on a file system every node sees) or pick another path"
            )
        return
    raise ConfigError(
        f"trainer.strategy.init_method '{init_method}' is not supported; "
        "use env://, tcp://HOST:PORT or file:///path"
    )


def _check_interface(name: str, backend: str) -> None:
    """Refuse an interface that does not exist here, listing the ones that do.

    Gloo takes one exact name. NCCL takes a prefix list (``eth,ib``), ``=`` for exact names, and
    ``^`` for exclusions (which need not exist, so they are not checked).
    """
    if backend == "gloo" and (name.startswith(("^", "=")) or "," in name):
        raise ConfigError(
            f"trainer.strategy.socket_ifname '{name}': Gloo takes one concrete interface name, "
            "not NCCL's '^', '=' or list syntax"
        )
    if name.startswith("^"):
        return
    known = [n for _, n in socket.if_nameindex()]
    exact = backend == "gloo" or name.startswith("=")
    for part in name.lstrip("=").split(","):
        found = part in known if exact else any(k.startswith(part) for k in known)
        if not found:
            raise ConfigError(
                f"trainer.strategy.socket_ifname: interface '{part}' does not exist on "
                f"{socket.gethostname()}{did_you_mean(part, known)}; interfaces here: {', '.join(known)}"
            )


def _explain_init_failure(err: Exception, strategy: DDPStrategy) -> DistributedSetupError:
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    where = strategy.init_method
    if where.startswith("env://"):
        where = f"env:// ({os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')})"
    info = strategy.dist
    joined = re.search(r"(\d+)/(\d+) clients joined", text)
    if joined or "timed out" in text.lower() or "timeout" in text.lower():
        arrived = f"{joined.group(1)} of {joined.group(2)} ranks arrived" if joined else "not every rank arrived"
        return DistributedSetupError(
            f"rendezvous at {where} timed out after {strategy.timeout:g} s: {arrived} "
            f"(this is rank {info.rank} of {info.world_size}). Check that all {info.world_size} "
            "ranks were started, that the master address is reachable from every node, and that "
            "no firewall blocks the port; raise trainer.strategy.timeout if ranks start slowly"
        )
    if "EADDRINUSE" in text or "address already in use" in text.lower():
        return DistributedSetupError(
            f"rendezvous port in use at {where}: another process listens there; pick a free port "
            "(MASTER_PORT=... or trainer.strategy.init_method=tcp://HOST:PORT)"
        )
    return DistributedSetupError(f"init_process_group({strategy.backend}) at {where} failed: {text}")
