"""The stores DDP ranks meet through under torchrun or fw's launcher (``DDPStrategy._elastic_store``
says why fw builds them): rank 0 of each attempt hosts a store of its own and publishes its
address in the agent's store; each ``init_process_group`` gets its own key prefix in it. Under
``mpiexec`` (no agent, no address given) rank 0's store address goes to the others over MPI.
``elastic_job_id`` names the job for its checkpoints by a nonce kept in the agent's store."""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
import time
import uuid

import torch.distributed as dist

from framework.errors import DistributedSetupError
from framework.rank_zero import rank_zero_warn


def prefixed_by_init(store: dist.Store, rank: int) -> dist.Store:
    count = store.add(f"fw/inits_of_rank_{rank}", 1)
    return dist.PrefixStore(f"fw/init_{count}", store)


#: ((agent store address, rank, world size), store) of this worker's attempt, made once
_ATTEMPT: tuple[tuple, dist.Store] | None = None
_PUBLISHED = "fw/attempt_store"  # key in the agent's store: "host:port:nonce" of rank 0's store


def attempt_store(rank: int, world_size: int, timeout: datetime.timedelta, socket_ifname: str | None) -> dist.Store:
    """A store that lives exactly as long as this attempt's rank 0: rank 0 hosts it on a free
    port and publishes ``host:port:nonce`` in the agent's store; the other ranks connect to it.
    A published address left by a dead attempt is recognised because nobody answers there any
    more (the agent stops every worker before a new round), or another store answers without
    this nonce; the ranks then read the key again until rank 0 of their attempt has set it."""
    global _ATTEMPT
    master_addr, master_port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    key = (master_addr, master_port, rank, world_size)
    if _ATTEMPT is not None and _ATTEMPT[0] == key:
        return _ATTEMPT[1]
    agent = dist.TCPStore(master_addr, master_port, world_size, is_master=False, timeout=timeout)
    store: dist.Store
    if rank == 0:
        store = dist.TCPStore("0.0.0.0", 0, world_size, is_master=True, timeout=timeout, wait_for_workers=False)
        nonce = uuid.uuid4().hex
        store.set("fw/nonce", nonce)
        agent.set(_PUBLISHED, f"{_reachable_address(master_addr, master_port, socket_ifname)}:{store.port}:{nonce}")
    else:
        store = _connect_to_published(agent, timeout)
    _ATTEMPT = (key, store)
    return store


def elastic_job_id() -> str | None:
    """The id a worker of the elastic agent gives its job's checkpoints, by which a restarted
    worker finds them: ``TORCHELASTIC_RUN_ID`` and a nonce that the first worker to ask leaves
    in the agent's store (None outside the agent).

    The run id alone names a rendezvous, not a job: torchrun's ``--rdzv-id`` is ``none`` unless
    given, and fw's launcher names a multi-node run by its endpoint, so a job restarted before
    its first checkpoint resumed the newest checkpoint of an earlier job in the same folder and
    ended with that job's weights. The agent's store lives as long as the job, its restarts
    included, and no longer. Without it (a rendezvous backend that keeps no store for the
    workers, such as etcd) the run id alone is used, with a warning on rank 0."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if not run_id:
        return None
    where = (run_id, os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT"))
    if where not in _JOB_IDS:  # asked once a process: its fits belong to one job
        _JOB_IDS[where] = _ask_for_job_id(run_id)
    return _JOB_IDS[where]


_JOB_IDS: dict[tuple[str, str | None, str | None], str] = {}


def _ask_for_job_id(run_id: str) -> str:
    try:
        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
            raise LookupError("the agent keeps no store for its workers")
        nonce = _agent_store().compare_set(f"fw/job_nonce/{run_id}", "", uuid.uuid4().hex).decode()
    except (LookupError, KeyError, ValueError, RuntimeError, dist.DistError) as err:
        rank_zero_warn(f"checkpoints are named by the elastic run id '{run_id}' alone ({err}): give every job "
                       "its own (torchrun --rdzv-id), or a restart may resume another job's checkpoint in the same folder")
        return run_id
    return f"{run_id}:{nonce}"


def _agent_store(tries: int = 4) -> dist.Store:
    """The elastic agent's store: the connection this process's group met over when there is one
    (the default group's store without the prefixes the agent and the group put on it: a
    restarted worker's prefix names its attempt), else a new connection. A new connection to the
    agent's store stalls now and then until its timeout (about 1 in 40 here, torch's agent and
    client alone, no fw code), so a new one is tried a few times, briefly."""
    address = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
    store = default_tcp_store()
    if store is not None and (store.host, store.port) == address:
        return store
    for _ in range(tries - 1):
        try:
            return dist.TCPStore(*address, is_master=False, timeout=datetime.timedelta(seconds=2))
        except (RuntimeError, dist.DistError):
            pass  # a stalled connection: a new one goes through
    return dist.TCPStore(*address, is_master=False, timeout=datetime.timedelta(seconds=2))  # its error is the caller's


def default_tcp_store() -> dist.TCPStore | None:
    """The TCP store the default process group met at, without the prefixes put on it (the
    agent's per attempt, the group's own), or None (no group, or it met elsewhere)."""
    from torch.distributed import distributed_c10d

    try:
        store = distributed_c10d._get_default_store()
    except (RuntimeError, ValueError):
        return None
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    return store if isinstance(store, dist.TCPStore) else None


def _connect_to_published(agent: dist.Store, timeout: datetime.timedelta) -> dist.Store:
    deadline = time.monotonic() + timeout.total_seconds()
    while True:
        host, port, nonce = agent.get(_PUBLISHED).decode().rsplit(":", 2)
        try:
            socket.create_connection((host, int(port)), timeout=2).close()  # refused at once when dead
            store = dist.TCPStore(host, int(port), is_master=False, timeout=datetime.timedelta(seconds=2))
            if store.check(["fw/nonce"]) and store.get("fw/nonce").decode() == nonce:
                store.set_timeout(timeout)
                return store
        except (OSError, RuntimeError, dist.DistError):
            pass  # a dead attempt's rank 0: wait for this attempt's to publish its store
        if time.monotonic() > deadline:
            raise dist.DistStoreError(f"timed out after {timeout.total_seconds():g} s: rank 0 never "
                                      f"published its store (last seen {host}:{port})")
        time.sleep(0.2)


def _reachable_address(master_addr: str, master_port: int, socket_ifname: str | None) -> str:
    """This host's address as the other nodes reach it: the named interface's, else the one
    that routes to the agent's store; on the store's own host, the store's address itself."""
    address = _interface_address(socket_ifname)
    if address:
        return address
    family, _, _, _, where = socket.getaddrinfo(master_addr, master_port, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect(where)  # UDP: no packet is sent, only the route is chosen
        address = probe.getsockname()[0]
    return master_addr if ipaddress.ip_address(address).is_loopback else address


def mpi_store(rank: int, world_size: int, host: str | None, timeout: datetime.timedelta,
              socket_ifname: str | None) -> dist.Store:
    """Under ``mpiexec`` with no ``MASTER_PORT``: rank 0 hosts a store on a free port and tells
    the other ranks where it is through MPI (as Lightning's MPIEnvironment does), so Gloo runs
    under an MPI launch with no port to choose. Rank 0's address is ``host`` when given (one node:
    ``127.0.0.1``; else ``MASTER_ADDR``), else the named interface's, else its host name."""
    try:
        from mpi4py import MPI
    except ImportError as err:
        raise DistributedSetupError(
            f"under mpiexec with no MASTER_PORT, fw sends the rendezvous address over MPI, which needs mpi4py "
            f"({err}): pip install mpi4py, or export MASTER_ADDR and MASTER_PORT for every rank") from None
    where = None
    if rank == 0:
        store = dist.TCPStore("0.0.0.0", 0, world_size, is_master=True, timeout=timeout, wait_for_workers=False)
        where = f"{host or _own_address(socket_ifname)}:{store.port}"
    address, port = MPI.COMM_WORLD.bcast(where, root=0).rsplit(":", 1)
    if rank == 0:
        return store
    return dist.TCPStore(address, int(port), world_size, is_master=False, timeout=timeout)


def _own_address(socket_ifname: str | None) -> str:
    return _interface_address(socket_ifname) or socket.gethostname()


def _interface_address(socket_ifname: str | None) -> str | None:
    """The IPv4 address of the named interface, if it has one."""
    if not socket_ifname:
        return None
    from framework.environments.network import interface_addresses

    return interface_addresses().get(socket_ifname)
