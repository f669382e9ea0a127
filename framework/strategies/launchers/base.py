"""What every launcher is (``Launcher``: one method, ``launch(fn, *args)``), how a launching
process ends when its workers ran the program (``JobEnded``), and the mpi strategy's launcher,
which only says how to start the job (``MPIExecLauncher``)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from framework.errors import ConfigError, ProgramEnds


class Launcher(ABC):
    """Starts a job's processes for one Trainer call: ``launch(fn, *args)`` runs ``fn(*args)``
    as every rank and returns rank 0's result here. How differs inside: ``SpawnLauncher``
    (``ddp_spawn``) calls ``fn`` in the workers it starts; ``ElasticLauncher`` re-runs the whole
    program in its workers, which make the call themselves, so this process ends instead
    (``JobEnded``, with the job's status)."""

    @abstractmethod
    def launch(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on every rank; rank 0's result, or ``JobEnded``."""


class JobEnded(ProgramEnds):
    """This process only launched the workers, which ran the whole program, and they are done:
    it ends with the job's exit status (the code after the call ran in every worker)."""


class MPIExecLauncher(Launcher):
    """MPI jobs are started by ``mpiexec``: say so, with the command."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size

    def launch(self, fn: Callable[..., Any], *args: Any) -> Any:
        raise ConfigError(
            f"trainer.strategy=mpi with {self.world_size} processes needs an MPI launcher: "
            f"mpiexec -n {self.world_size} fw fit ... (or set trainer.devices=1)"
        )
