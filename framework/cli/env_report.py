"""``fw env``: everything worth knowing when a distributed job hangs, in one plain-text report.

Run it the way the job runs (``srun fw env``, ``mpiexec -n 2 fw env``, ``torchrun ... fw env``)
to see, from each process: Python, torch and CUDA versions; which ``torch.distributed``
backends are built in; the GPUs; mpi4py and the MPI library; the network interfaces and their
IPv4 addresses (for ``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME``); the detected cluster
environment with its ranks and master address/port; and the relevant variables that are set.

Every section is gathered on its own: a failure there is printed in the report instead of
stopping it, because a diagnostic tool that crashes helps nobody.
"""

from __future__ import annotations

import os
import platform
import socket
import sys
from collections.abc import Callable, Mapping, Sequence

from framework.environments.network import interface_addresses
from framework.errors import install_command

Lines = list[tuple[str, str]]

#: Variables shown when set; the ones that decide where a rendezvous goes or how it fails.
REPORTED_VARS = (
    "MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
    "GROUP_RANK", "TORCHELASTIC_RUN_ID",
    "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "NCCL_DEBUG", "NCCL_IB_DISABLE",
    "NCCL_P2P_DISABLE", "TORCH_DISTRIBUTED_DEBUG", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS",
    "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS",
    "SLURM_NNODES", "SLURM_NODEID", "SLURM_NODELIST", "SLURM_STEP_NODELIST",
    "SLURM_TASKS_PER_NODE", "SLURM_CPUS_ON_NODE",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
    "PMI_RANK", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
    "KUBERNETES_SERVICE_HOST", "PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR",
    "PET_MASTER_PORT",
)


def env_report(env: Mapping[str, str] | None = None, argv: Sequence[str] | None = None) -> str:
    """Return the ``fw env`` report as plain text.

    Args:
        env: variables to inspect; ``os.environ`` when ``None``.
        argv: command line; ``sys.argv`` when ``None``.
    """
    env = os.environ if env is None else env
    sections: list[tuple[str, Callable[[], Lines]]] = [
        ("system", system_lines),
        ("torch", torch_lines),
        ("mpi", lambda: mpi_lines(env)),
        ("network", network_lines),
        ("cluster environment", lambda: cluster_lines(env, argv)),
        ("environment variables", lambda: env_var_lines(env)),
    ]
    out: list[str] = []
    for title, gather in sections:
        try:
            lines = gather()
        except Exception as err:  # a report must never crash
            lines = [("error", f"{type(err).__name__}: {err}")]
        out.append(f"[{title}]")
        width = max((len(key) for key, _ in lines), default=0)
        out.extend(f"  {key.ljust(width)}  {value}" for key, value in lines)
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def system_lines() -> Lines:
    """Host, OS and Python."""
    return [
        ("hostname", socket.gethostname()),
        ("platform", platform.platform()),
        ("python", f"{platform.python_version()} ({sys.executable})"),
        ("pid", str(os.getpid())),
    ]


def torch_lines() -> Lines:
    """torch, CUDA, the distributed backends and the GPUs."""
    import torch
    import torch.distributed as dist

    lines: Lines = [("torch", torch.__version__), ("cuda (build)", str(torch.version.cuda))]
    if dist.is_available():
        import importlib.util

        backends = {
            "gloo": "yes" if dist.is_gloo_available() else "no",
            "nccl": "yes" if dist.is_nccl_available() else "no",
            # the mpi strategy runs on torch's own MPI backend or, without it, on fw's over mpi4py
            "mpi": "yes (torch's)" if dist.is_mpi_available() else
                   "yes (fw's, over mpi4py)" if importlib.util.find_spec("mpi4py") else f"no ({install_command('mpi')})",
        }
        lines.append(("backends", ", ".join(f"{k}={v}" for k, v in backends.items())))
    else:
        lines.append(("backends", "torch.distributed is not available in this build"))
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    lines.append(("gpus", str(count)))
    for index in range(count):
        lines.append((f"gpu {index}", torch.cuda.get_device_name(index)))
    if count:
        lines.append(("nccl version", ".".join(map(str, torch.cuda.nccl.version()))))
    return lines


def mpi_lines(env: Mapping[str, str]) -> Lines:
    """mpi4py and the MPI library, and this process's place in ``COMM_WORLD``.

    Importing ``mpi4py.MPI`` initializes MPI, so it happens only under an MPI launcher or in a
    plain process (a singleton), never inside torchrun or srun tasks, where an MPI singleton
    could try to join the wrong job.
    """
    import importlib.util

    from framework.environments import MPIEnvironment, SLURMEnvironment, TorchElasticEnvironment

    if importlib.util.find_spec("mpi4py") is None:
        return [("mpi4py", "not installed (pip install mpi4py for strategy=mpi)")]
    import mpi4py

    lines: Lines = [("mpi4py", mpi4py.__version__)]
    under_mpi = MPIEnvironment.detect(env)
    if not under_mpi and (TorchElasticEnvironment.detect(env) or SLURMEnvironment.detect(env)):
        lines.append(("MPI", "not initialized here (not under mpiexec)"))
        return lines
    from mpi4py import MPI

    library = MPI.Get_library_version().strip().splitlines()
    lines.append(("library", library[0] if library else "?"))
    lines.append(("MPI standard", "{}.{}".format(*MPI.Get_version())))
    world = MPI.COMM_WORLD
    kind = "" if under_mpi else " (singleton: no MPI launcher detected)"
    lines.append(("COMM_WORLD", f"rank {world.Get_rank()} of {world.Get_size()}{kind}"))
    return lines


def network_lines() -> Lines:
    """Each network interface with its IPv4 address, if any."""
    addresses = interface_addresses()
    if not addresses:
        return [("interfaces", "none found")]
    return [(name, addr or "(no IPv4 address)") for name, addr in addresses.items()]


def cluster_lines(env: Mapping[str, str], argv: Sequence[str] | None = None) -> Lines:
    """The detected environment, its ranks, and where the rendezvous will go."""
    from framework.environments import check_slurm_batch_trap, detect_environment
    from framework.errors import DistributedSetupError

    environment = detect_environment(env, argv)
    lines: Lines = [
        ("detected", environment.name),
        ("launched externally", "yes" if environment.launched_externally else "no"),
    ]
    try:
        info = environment.info()
    except DistributedSetupError as err:
        return [*lines, ("error", str(err))]
    lines += [
        ("rank", f"{info.rank} of {info.world_size}"),
        ("local rank", f"{info.local_rank} of {info.local_world_size}"),
        ("node", f"{info.node_rank} of {info.num_nodes}"),
        ("master addr", info.master_addr),
        ("master port", str(info.master_port) if info.master_port else "(not set: fw picks one)"),
        ("master resolves to", _resolve(info.master_addr)),
    ]
    try:
        check_slurm_batch_trap(env, requested_world_size=2)
    except DistributedSetupError as err:
        lines.append(("WARNING", str(err)))
    return lines


def _resolve(host: str) -> str:
    """The IPv4 address ``host`` resolves to, or why it does not."""
    try:
        return socket.gethostbyname(host)
    except OSError as err:
        return f"cannot resolve: {err}"


def env_var_lines(env: Mapping[str, str]) -> Lines:
    """The variables of ``REPORTED_VARS`` that are set."""
    lines = [(key, env[key]) for key in REPORTED_VARS if key in env]
    return lines or [("(none set)", "")]
