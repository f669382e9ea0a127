"""``ClusterEnvironment``: the interface every launcher environment implements.

An environment answers four questions from its launcher's variables: is this process running
under me (``detect``), where does it stand (``info``), did someone else already start the
worker processes (``launched_externally``), and does the job it started match the run's
``devices`` and ``num_nodes`` (``check``)? One small subclass per launcher lives next to this
file; ``framework.environments.detect_environment`` picks the first that detects.
"""

from __future__ import annotations

import os
import sys
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import overload

from framework.environments.info import DistInfo
from framework.errors import ConfigError, DistributedSetupError


@dataclass(frozen=True)
class AssignedNode:
    """Where a job's own launcher put this node, for fw's launcher to start the node's workers
    there (torchrun's static rendezvous: ``--node-rank``, ``--master-addr``, ``--master-port``).

    Attributes:
        node_rank: this node's index; its workers are ranks ``node_rank * devices + local_rank``.
        num_nodes: the nodes of the job.
        endpoint: ``HOST:PORT`` where the nodes meet (node 0 hosts the store there).
        summary: one line for the start-up, saying where this node stands.
    """

    node_rank: int
    num_nodes: int
    endpoint: str
    summary: str


class ClusterEnvironment(ABC):
    """Reads one launcher's variables and turns them into a ``DistInfo``.

    Args:
        env: the variables to read; ``os.environ`` when ``None``. Tests pass a dict.
        argv: the command line; ``sys.argv`` when ``None`` (``torch.distributed.launch``
            passes ``--local_rank`` there).
    """

    name: str = ""

    def __init__(
        self, env: Mapping[str, str] | None = None, argv: Sequence[str] | None = None
    ) -> None:
        self.env: Mapping[str, str] = os.environ if env is None else env
        self.argv: Sequence[str] = sys.argv if argv is None else argv

    def __getstate__(self) -> dict:
        """Picklable (``ddp_spawn`` sends the Trainer to its workers): ``os.environ`` goes as
        a marker and is the worker's own ``os.environ`` again on the other side."""
        state = dict(self.__dict__)
        if state.get("env") is os.environ:
            state["env"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if self.env is None:
            self.env = os.environ

    @staticmethod
    @abstractmethod
    def detect(env: Mapping[str, str]) -> bool:
        """Return True when ``env`` shows that this launcher started the process."""

    @abstractmethod
    def info(self) -> DistInfo:
        """Return where this process stands.

        Raises:
            DistributedSetupError: a variable is malformed or the values contradict each other.
        """

    @property
    def launched_externally(self) -> bool:
        """True when the launcher already started every worker process, so fw must not."""
        return True

    def check(self, devices: int, num_nodes: int) -> None:
        """Refuse a job whose shape does not match ``devices`` per node and ``num_nodes``, with
        a hint that says how to fix it (called only for multi-process strategies).

        Raises:
            ConfigError: the launcher started another number of processes.
        """
        info = self.info()
        if info.local_world_size != devices:
            raise ConfigError(
                f"the {info.source} launcher started {info.local_world_size} process(es) on this node but "
                f"trainer.devices={devices}. HINT: set trainer.devices={info.local_world_size}, or start "
                f"{devices} process{'' if devices == 1 else 'es'} per node"
            )
        if info.world_size != devices * num_nodes:
            raise ConfigError(
                f"the {info.source} launcher started {info.world_size} process(es) in all but "
                f"trainer.devices * trainer.num_nodes = {devices * num_nodes}. "
                f"HINT: set trainer.num_nodes={max(1, info.world_size // max(devices, 1))}"
            )

    def assigned_node(self, devices: int) -> AssignedNode | None:
        """For fw's launcher, when this environment numbered the nodes but left the processes
        to fw (a Kubeflow pod): this node's rank and where the nodes meet, with ``devices``
        processes per node; None (the default) when fw's launcher finds the ranks itself."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


@overload
def env_int(env: Mapping[str, str], *keys: str, default: int) -> int: ...


@overload
def env_int(env: Mapping[str, str], *keys: str, default: None = None) -> int | None: ...


def env_int(env: Mapping[str, str], *keys: str, default: int | None = None) -> int | None:
    """Return the first of ``keys`` set in ``env`` as an int, or ``default``.

    Raises:
        DistributedSetupError: the variable is set but is not an integer.
    """
    for key in keys:
        raw = env.get(key)
        if raw is None or raw.strip() == "":
            continue
        try:
            return int(raw.strip())
        except ValueError:
            raise DistributedSetupError(
                f"environment variable {key}={raw!r} is not an integer"
            ) from None
    return default


@overload
def env_str(env: Mapping[str, str], *keys: str, default: str) -> str: ...


@overload
def env_str(env: Mapping[str, str], *keys: str, default: None = None) -> str | None: ...


def env_str(env: Mapping[str, str], *keys: str, default: str | None = None) -> str | None:
    """Return the first of ``keys`` set (and non-empty) in ``env``, or ``default``."""
    for key in keys:
        raw = env.get(key)
        if raw is not None and raw.strip():
            return raw.strip()
    return default


def require_int(env: Mapping[str, str], source: str, *keys: str) -> int:
    """Like ``env_int`` but the variable must be set.

    Raises:
        DistributedSetupError: none of ``keys`` is set, or the value is not an integer.
    """
    value = env_int(env, *keys)
    if value is None:
        raise DistributedSetupError(
            f"{source} environment detected but {' / '.join(keys)} is not set"
        )
    return value
