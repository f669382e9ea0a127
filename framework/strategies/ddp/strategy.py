"""DistributedDataParallel over Gloo or NCCL: one process per device.

``ddp_gloo`` and ``ddp_nccl`` are this one class with another ``backend``. The process group is
set up from the detected cluster environment (rank, world size, master address) with the init
method the recipe names: ``env://`` (default), ``tcp://host:port`` or ``file:///path``. Without
a launcher around, fw starts the workers itself (``ElasticLauncher``).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
import torch.distributed as dist

from framework.environments import ClusterEnvironment
from framework.errors import ConfigError, DistributedSetupError, did_you_mean
from framework.strategies.distributed import DEFAULT_TIMEOUT_S, DistributedStrategy
from framework.strategies.launchers import ElasticLauncher, Launcher
from framework.strategies.launchers.processes import beside
from framework.strategies.launchers.rendezvous import attempt_store, prefixed_by_init

#: what set-up may write into ``os.environ`` for ``init_process_group``; teardown puts it back
_SET_UP_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


class DDPStrategy(DistributedStrategy):
    """DDP with ``backend`` in {gloo, nccl}; options as in the recipe's strategy mapping.

    Args:
        backend: ``gloo`` or ``nccl``.
        init_method: ``env://``, ``tcp://host:port`` or ``file:///path``.
        timeout: seconds to wait for every rank at start-up and in each collective.
        socket_ifname: network interface for Gloo/NCCL traffic (sets GLOO_SOCKET_IFNAME or
            NCCL_SOCKET_IFNAME after checking that it exists on this host).
        find_unused_parameters, bucket_cap_mb, static_graph, gradient_as_bucket_view: passed
            to ``DistributedDataParallel``.
        process_group: the group DDP all-reduces gradients over instead of the default group
            (e.g. one of another backend beside it; made in this process, so not for ddp_spawn).
            The run's other collectives stay on the default group.
    """

    def __init__(
        self,
        backend: str = "gloo",
        init_method: str = "env://",
        timeout: float = DEFAULT_TIMEOUT_S,
        socket_ifname: str | None = None,
        find_unused_parameters: bool = False,
        bucket_cap_mb: float | None = None,
        static_graph: bool = False,
        gradient_as_bucket_view: bool = False,
        process_group: dist.ProcessGroup | None = None,
    ) -> None:
        super().__init__(timeout, find_unused_parameters, bucket_cap_mb, static_graph, gradient_as_bucket_view)
        if process_group is not None:
            self.ddp_kwargs["process_group"] = process_group
        if backend not in ("gloo", "nccl"):
            raise ConfigError(f"trainer.strategy.backend: unknown backend '{backend}'; use gloo or nccl")
        self.backend = backend
        self.name = f"ddp_{backend}"
        self.init_method = str(init_method)
        self.socket_ifname = socket_ifname
        _check_init_method(self.init_method)
        if socket_ifname:
            _check_interface(socket_ifname, backend)  # here, before any worker is started
        self._environ_before: dict[str, str | None] = {}
        self._address_over_mpi = False  # env:// under mpiexec: rank 0's store address went over MPI

    def launcher(self, environment: ClusterEnvironment, num_nodes: int, max_restarts: int,
                 rdzv_endpoint: str | None) -> Launcher | None:
        if not self._needs_launcher(environment, num_nodes):
            return None
        return ElasticLauncher(len(self.devices), num_nodes, max_restarts, rdzv_endpoint, self.socket_ifname, self.timeout,
                               node=environment.assigned_node(len(self.devices)))

    # -- set-up ---------------------------------------------------------------------------
    def setup_environment(self) -> None:
        self._environ_before = {key: os.environ.get(key) for key in _SET_UP_VARIABLES}
        if self.socket_ifname:
            os.environ["NCCL_SOCKET_IFNAME" if self.backend == "nccl" else "GLOO_SOCKET_IFNAME"] = (
                self.socket_ifname
            )
        super().setup_environment()

    def teardown(self) -> None:
        super().teardown()
        # The address and interface go with the group: a later run in this process must not
        # find a stale port (a num_nodes > 1 launch takes MASTER_ADDR/MASTER_PORT for its
        # rendezvous), and the process is left as it was found.
        for key, value in self._environ_before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._environ_before = {}

    def _init_process_group(self) -> None:
        info = self.dist
        own_store: dist.Store | None = None
        given_addr = os.environ.get("MASTER_ADDR")
        if self.init_method.startswith("env://"):
            # torchrun sets these; under SLURM or MPI they come from the detected environment
            os.environ.setdefault("MASTER_ADDR", info.master_addr)
            if info.master_port is not None:
                os.environ.setdefault("MASTER_PORT", str(info.master_port))
            elif info.world_size == 1 and "MASTER_PORT" not in os.environ:
                # a world of one talks only to itself: a store on a port it holds from bind to end
                own_store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
            elif info.source == "mpi" and "MASTER_PORT" not in os.environ:
                from framework.strategies.launchers.rendezvous import mpi_store

                host = "127.0.0.1" if info.num_nodes == 1 else given_addr
                own_store = mpi_store(info.rank, info.world_size, host, datetime.timedelta(seconds=self.timeout),
                                      self.socket_ifname)
                self._address_over_mpi = True
            if "MASTER_PORT" not in os.environ and own_store is None:
                raise DistributedSetupError(
                    "init_method env:// needs MASTER_PORT; set it (e.g. export MASTER_PORT=29500) "
                    "or name one with trainer.strategy.init_method=tcp://HOST:PORT"
                )
        timeout = datetime.timedelta(seconds=self.timeout)
        try:
            with _say_while_waiting(self):
                store = own_store or self._elastic_store(timeout)
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
        - the agent's store outlives a process group and a restart of the workers, so the
          first group of a restarted worker would read the dead attempt's keys and hang. The
          agent's restart count cannot tell attempts apart either: on several nodes, the agent
          whose workers were healthy restarts them without counting. So rank 0 of each attempt
          hosts a store of its own (``rendezvous.attempt_store``) and only its address goes through the
          agent's store.

        Each ``init_process_group`` of the attempt (``fit`` then ``test``: torch restarts its
        group numbering when a group is destroyed) gets its own key prefix, counted in the store
        so that the ranks agree without a process global.
        """
        if self.init_method.startswith("file://") or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
            return None
        rank, world_size = self.dist.rank, self.dist.world_size
        if self.init_method.startswith("tcp://"):
            url = urlparse(self.init_method)
            assert url.hostname is not None and url.port is not None, "checked by _check_init_method"
            if str(url.port) != os.environ.get("MASTER_PORT"):  # not the agent's: rank 0 hosts it
                hosted = dist.TCPStore(url.hostname, url.port, world_size, is_master=rank == 0,
                                       timeout=timeout, multi_tenant=True)
                return prefixed_by_init(hosted, rank)
        store = attempt_store(rank, world_size, timeout, self.socket_ifname)
        return prefixed_by_init(store, rank)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(),
                "init_method": self.init_method + (" (rank 0's address sent over MPI)" if self._address_over_mpi else "")}

    # -- collectives ----------------------------------------------------------------------
    @property
    def collective_device(self) -> torch.device:
        return self.root_device if self.backend == "nccl" else torch.device("cpu")

    def barrier(self, name: str | None = None) -> None:
        if self.backend == "nccl":
            dist.barrier(device_ids=[self.root_device.index])
        else:
            dist.barrier()


@contextlib.contextmanager
def _say_while_waiting(strategy: DDPStrategy, first: float = 5.0, every: float = 15.0) -> Iterator[None]:
    """While the rendezvous blocks, say on stderr what this rank waits for, every ``every`` s."""
    done = threading.Event()
    info, started = strategy.dist, time.monotonic()

    def report() -> None:
        wait = first
        while not done.wait(wait):
            sys.stderr.write(
                f"fw: rank {info.rank} of {info.world_size} is waiting for the other ranks at "
                f"{_where(strategy)} ({time.monotonic() - started:.0f} s of the {strategy.timeout:g} s "
                "timeout, trainer.strategy.timeout)\n")
            sys.stderr.flush()
            wait = every

    with beside(report, "fw-rendezvous-report", done):
        yield


def _where(strategy: DDPStrategy) -> str:
    where = strategy.init_method
    if where.startswith("env://"):
        where = f"env:// ({os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')})"
    return where


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
    where = _where(strategy)
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
