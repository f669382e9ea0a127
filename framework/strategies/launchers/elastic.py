"""``ElasticLauncher`` (DDP over Gloo or NCCL): without a launcher around and with
``devices * num_nodes > 1``, fw re-runs the current command (``fw fit ...`` or ``python
script.py``) in one worker per device through torch.distributed.run's elastic agent, the engine
behind ``torchrun``: it sets RANK/LOCAL_RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, watches the
workers, and when one fails it stops the others and reports that worker's error (a worker
stopped by SIGSTOP is resumed so that it acts on that SIGTERM: ``processes.py``). The launching
process does not train: once the workers are done it ends with the job's status
(``JobEnded``). On one node the agent binds the rendezvous port itself (``127.0.0.1:0``, as
``torchrun --standalone``), so jobs started at once on one machine never race for a port.

For several nodes, run the same command on every node with the same ``rdzv_endpoint``
(``trainer.rdzv_endpoint=HOST:PORT``, or MASTER_ADDR/MASTER_PORT), as with torchrun; the node
that owns HOST's address hosts the rendezvous. Where the job's own launcher numbered the nodes
(a Kubeflow pod: ``AssignedNode``), the agent takes that node rank and endpoint, as torchrun
with ``--node-rank``, ``--master-addr`` and ``--master-port`` (its static rendezvous: node 0
hosts the store), and the launch begins with the environment's one line saying where it stands. ``FW_DEBUG_LAUNCH=1`` shows the elastic agent's
log (rendezvous rounds, worker starts) when a launch hangs.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from framework.errors import ConfigError
from framework.strategies.launchers.base import JobEnded, Launcher
from framework.strategies.launchers.processes import LAUNCHER_PID as _LAUNCHER_PID
from framework.strategies.launchers.worker_failures import leave_tracebacks_to_the_launcher, report_failures

if TYPE_CHECKING:
    from torch.distributed.launcher.api import LaunchConfig

    from framework.environments import AssignedNode

#: signals a worker turns into a clean stop with a checkpoint (trainer/preemption.py, default setup)
_WORKERS_STOP_ON = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
#: signals a worker starts with blocked, to act on once its fit can: the preemption signal, which
#: SLURM sends early (``--signal=USR1@90``); not SIGTERM, with which the agent ends workers that
#: failed to start (a blocked one would hold a restart for the agent's 30 s), nor a Ctrl-C
_BLOCKED_UNTIL_FIT = (signal.SIGUSR1,)
#: signals the elastic agent passes on to the workers (the one that ends a job is SIGTERM)
_PASSED_ON = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1)


class ElasticLauncher(Launcher):
    """One worker per device on this node, through torch's elastic agent (see the module doc)."""

    def __init__(self, nproc_per_node: int, num_nodes: int = 1, max_restarts: int = 0,
                 rdzv_endpoint: str | None = None, socket_ifname: str | None = None, timeout: float = 300.0,
                 node: AssignedNode | None = None) -> None:
        self.nproc_per_node, self.num_nodes, self.max_restarts = nproc_per_node, num_nodes, max_restarts
        self.rdzv_endpoint, self.socket_ifname, self.timeout = rdzv_endpoint, socket_ifname, timeout
        self.node = node
        if node is not None:
            _check_assigned(node, max_restarts, rdzv_endpoint)

    def launch(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Each worker re-runs this program and makes the call itself (``fn`` runs there)."""
        current_command()  # refuses here, before anything starts, when there is no program to re-run
        if self.node is not None:
            from framework.rank_zero import library_logger

            library_logger().info("fw: %s", self.node.summary)
        raise JobEnded(launch_workers(self.nproc_per_node, self.num_nodes, self.max_restarts,
                                      self.rdzv_endpoint, self.socket_ifname, self.timeout, self.node))


def _check_assigned(node: AssignedNode, max_restarts: int, rdzv_endpoint: str | None) -> None:
    """The job's launcher numbered the nodes and restarts them: refuse what would contradict it.

    Raises:
        ConfigError: ``trainer.max_restarts`` or ``trainer.rdzv_endpoint`` is set.
    """
    if max_restarts:
        raise ConfigError(
            f"trainer.max_restarts={max_restarts}: this node's job restarts failed nodes itself (Kubeflow: the "
            "pod's restartPolicy); set trainer.max_restarts=0 and ckpt_path=last so that a restarted pod resumes "
            "its newest checkpoint")
    if rdzv_endpoint is not None and rdzv_endpoint != node.endpoint:
        raise ConfigError(
            f"trainer.rdzv_endpoint={rdzv_endpoint}: the job names where its nodes meet ({node.endpoint}); "
            "leave trainer.rdzv_endpoint unset")


def current_command() -> list[str]:
    """The arguments that re-run this program: ``-m pkg`` when started with ``python -m``."""
    import __main__
    from framework.environments.interactive import interactive_session

    session = interactive_session()
    if session:  # a Jupyter kernel's argv would start a second kernel on the same ports in each worker
        raise ConfigError(
            f"fw's launcher (strategy ddp/ddp_gloo/fsdp with devices > 1) re-runs the program in each worker, and "
            f"{session} has no program to re-run: use strategy='ddp_notebook' (workers forked from this process), "
            "or put the code in a script and run it (or launch it with torchrun --nproc-per-node=N script.py)"
        )
    spec = getattr(__main__, "__spec__", None)
    if spec is not None and spec.name not in ("__main__", None):
        name = spec.name[: -len(".__main__")] if spec.name.endswith(".__main__") else spec.name
        return ["-m", name, *sys.argv[1:]]
    return [os.path.abspath(sys.argv[0]), *sys.argv[1:]]


def launch_workers(nproc_per_node: int, num_nodes: int = 1, max_restarts: int = 0,
                   rdzv_endpoint: str | None = None, socket_ifname: str | None = None, timeout: float = 300.0,
                   node: AssignedNode | None = None) -> int:
    """Run the current command in ``nproc_per_node`` workers on this node; return the exit code
    (the agent's configuration: ``_launch_config``, or ``_assigned_config`` for a ``node`` the
    job numbered). At the job's end the agent waits for the other nodes' agents at most
    ``timeout`` seconds (``processes.exit_barrier_within``)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    config = (_launch_config(nproc_per_node, num_nodes, max_restarts, rdzv_endpoint, socket_ifname) if node is None
              else _assigned_config(nproc_per_node, node, socket_ifname, timeout))
    # fw prints its own one-line summary of a failure; the agent's log lines would repeat it
    agent_log = logging.getLogger("torch.distributed.elastic")
    level = agent_log.level
    agent_log.setLevel(logging.CRITICAL if not os.environ.get("FW_DEBUG_LAUNCH") else logging.INFO)
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc_per_node)))
    os.environ[_LAUNCHER_PID] = str(os.getpid())  # workers die with this process (as_launcher_worker)
    from framework.strategies.launchers.processes import exit_barrier_within, resume_stopped_workers, started_blocking

    try:
        with resume_stopped_workers(_PASSED_ON), started_blocking(_BLOCKED_UNTIL_FIT), exit_barrier_within(timeout):
            _launch_hosting_once(config)
    except SignalException as err:
        name = signal.Signals(err.sigval).name
        if err.sigval in _WORKERS_STOP_ON:  # workers stop after their step, write preempted.ckpt, exit 0
            sys.stderr.write(f"fw: launcher received {name}: the workers were told to stop after their step "
                             "and write a checkpoint (preempted.ckpt)\n")
            return 0
        sys.stderr.write(f"fw: launcher received {name}: the workers were stopped\n")
        return 128 + int(err.sigval)
    except ChildFailedError as err:
        return report_failures(err.failures)  # the first failure's traceback once, a line per other
    finally:
        agent_log.setLevel(level)
    return 0


def _launch_config(nproc_per_node: int, num_nodes: int, max_restarts: int, rdzv_endpoint: str | None,
                   socket_ifname: str | None) -> LaunchConfig:
    """torch's ``LaunchConfig`` for this node. On one node the agent binds a free rendezvous port
    itself and holds it (torchrun's ``--standalone``): no other job can take it in between. With
    several nodes, the node whose interfaces carry the endpoint's address hosts the rendezvous,
    and this node is announced by the address of ``socket_ifname`` when one is named (its host
    name may not resolve to an address the other nodes can reach)."""
    from torch.distributed.launcher.api import LaunchConfig

    if rdzv_endpoint is None:
        if num_nodes > 1:
            if "MASTER_ADDR" not in os.environ or "MASTER_PORT" not in os.environ:
                raise ConfigError(
                    f"trainer.num_nodes={num_nodes}: name the rendezvous host, the same on every node: "
                    "trainer.rdzv_endpoint=HOST:PORT (or export MASTER_ADDR and MASTER_PORT)"
                )
            rdzv_endpoint = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
        else:
            rdzv_endpoint = "127.0.0.1:0"
    rdzv_configs, local_addr = _rendezvous_role(rdzv_endpoint, socket_ifname) if num_nodes > 1 else ({}, None)
    return LaunchConfig(
        min_nodes=num_nodes,
        max_nodes=num_nodes,
        nproc_per_node=nproc_per_node,
        # every node of a job must name the same rendezvous (torchrun's --rdzv-id)
        run_id=os.environ.get("FW_RUN_ID") or (f"fw-{rdzv_endpoint}" if num_nodes > 1 else uuid.uuid4().hex[:12]),
        rdzv_backend="c10d",
        rdzv_endpoint=rdzv_endpoint,
        rdzv_configs=rdzv_configs,
        local_addr=local_addr,
        max_restarts=max_restarts,
        monitor_interval=0.1,
        start_method="spawn",
        # the agent passes these on to the workers, which stop after their step and write a
        # checkpoint (trainer/preemption.py); without SIGUSR1 here it would kill the launcher alone
        signals_to_handle=",".join(s.name for s in _PASSED_ON),
    )


def _assigned_config(nproc_per_node: int, node: AssignedNode, socket_ifname: str | None,
                     timeout: float) -> LaunchConfig:
    """torch's ``LaunchConfig`` for a node the job numbered: torchrun's static rendezvous (what
    ``torchrun --nnodes N --node-rank R --master-addr A --master-port P`` runs), where node 0's
    agent hosts the store at the endpoint and every node waits for it up to ``timeout``."""
    from torch.distributed.launcher.api import LaunchConfig

    from framework.environments.network import interface_addresses

    return LaunchConfig(
        min_nodes=node.num_nodes,
        max_nodes=node.num_nodes,
        nproc_per_node=nproc_per_node,
        run_id=os.environ.get("FW_RUN_ID") or f"fw-{node.endpoint}",
        rdzv_backend="static",
        rdzv_endpoint=node.endpoint,
        rdzv_configs={"rank": node.node_rank, "timeout": int(timeout)},
        local_addr=interface_addresses().get(socket_ifname) if socket_ifname else None,
        max_restarts=0,
        monitor_interval=0.1,
        start_method="spawn",
        signals_to_handle=",".join(s.name for s in _PASSED_ON),
    )


def _launch_hosting_once(config: LaunchConfig) -> None:
    """Run the agent. Two nodes' launchers on one host (a test, or the two-node command of
    docs/guides/intermediate/multi-node.md tried on one machine) both own the endpoint's address:
    the one that loses the race to bind the rendezvous port joins as a client instead of failing
    with EADDRINUSE."""
    import dataclasses

    from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError
    from torch.distributed.launcher.api import elastic_launch

    try:
        elastic_launch(config, entrypoint=sys.executable)(*current_command())
    except RendezvousConnectionError as err:
        text = f"{err} {err.__cause__ or ''}".lower()
        if not config.rdzv_configs.get("is_host") or ("address already in use" not in text and "eaddrinuse" not in text):
            raise
        client = dataclasses.replace(config, rdzv_configs={**config.rdzv_configs, "is_host": False})
        elastic_launch(client, entrypoint=sys.executable)(*current_command())


def _port_taken(host: str, port: int) -> bool:
    """Is ``host:port`` bound already on this machine (another launcher hosts the rendezvous)?"""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False


def _rendezvous_role(endpoint: str, socket_ifname: str | None) -> tuple[dict, str | None]:
    """(``{"is_host": ...}`` when it can be told, this node's address or None)."""
    from framework.environments.network import interface_addresses

    addresses = interface_addresses()
    mine = {a for a in addresses.values() if a}
    host = endpoint.rsplit(":", 1)[0]
    try:
        host_ip = socket.gethostbyname(host)
    except OSError:
        host_ip = None
    configs = {"is_host": host_ip in mine or host == socket.gethostname()} if host_ip else {}
    if host_ip and configs.get("is_host") and _port_taken(host_ip, int(endpoint.rsplit(":", 1)[1])):
        configs["is_host"] = False  # another node's launcher on this host hosts it already
    local_addr = addresses.get(socket_ifname) if socket_ifname else None
    if local_addr is None and configs.get("is_host") and host_ip not in ("127.0.0.1", None):
        local_addr = host_ip
    return configs, local_addr


def as_launcher_worker() -> None:
    """In a worker of fw's launcher: leave the printing of a failure's traceback to the launcher
    (``worker_failures.py``), and have the kernel send SIGTERM when the launcher dies, even
    by SIGKILL, so that no worker trains on unsupervised (it stops after its step, see
    ``trainer/preemption.py``). A process that a worker starts in turn inherits the variable but
    not the launcher as its parent, and is left alone. Linux only; elsewhere nothing."""
    launcher = os.environ.get(_LAUNCHER_PID)
    if launcher:
        leave_tracebacks_to_the_launcher()
    if not launcher or not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    if parent == 1:  # the launcher died before we could ask: this worker is an orphan already
        os.kill(os.getpid(), signal.SIGTERM)
        return
    if str(parent) != launcher:
        return
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
