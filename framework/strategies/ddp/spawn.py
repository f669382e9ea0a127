"""``ddp_spawn`` and ``ddp_notebook``: DDP whose workers are started from inside ``fit`` with
torch.multiprocessing, as Lightning's strategies of those names do.

fw's usual launcher re-runs the whole program in each worker, which needs a program to re-run.
From a notebook, ``python -`` or an interactive session there is none; these strategies start
the workers from the call itself instead:

- ``ddp_spawn``: fresh interpreters (start method ``spawn``); the Trainer, the module and the
  data are pickled to them, so their classes must be importable (defined in a file).
- ``ddp_notebook`` (alias ``ddp_fork``): forked copies of this process (start method ``fork``),
  so classes defined in a notebook cell or in ``python -`` work. CUDA must not have been
  initialised in this process before (a CUDA context does not survive a fork).

Each worker runs the call (``fit``, ``validate``, ...) as one rank, with this process's RNG
state and seed. When they are done, rank 0's outcome comes back to the caller as one value
(``trainer/spawned_outcome.py``), which the Trainer applies, as Lightning does: the trained weights are
loaded into the caller's module, and ``callback_metrics``, ``global_step``, ``current_epoch``,
the checkpoint callbacks' best/last paths and the call's return value are the workers'. A
failing worker ends the call with that worker's traceback. The workers are started by
``SpawnLauncher`` (``strategies/launchers/spawn.py``).
"""

from __future__ import annotations

from typing import Any

from framework.environments import ClusterEnvironment
from framework.errors import ConfigError
from framework.strategies.ddp.strategy import DDPStrategy
from framework.strategies.launchers import Launcher, SpawnLauncher


class SpawnDDPStrategy(DDPStrategy):
    """DDP (``backend`` gloo or nccl) with workers started by torch.multiprocessing."""

    def __init__(self, start_method: str = "spawn", **options: Any) -> None:
        super().__init__(**options)
        self.start_method = start_method
        self.name = "ddp_notebook" if start_method == "fork" else "ddp_spawn"

    def launcher(self, environment: ClusterEnvironment, num_nodes: int, max_restarts: int,
                 rdzv_endpoint: str | None) -> Launcher | None:
        if not self._needs_launcher(environment, num_nodes):
            return None
        if num_nodes > 1:
            raise ConfigError(f"trainer.strategy={self.name} starts workers on this machine only; for "
                              f"num_nodes={num_nodes} use ddp (fw's launcher or torchrun on every node)")
        if max_restarts:
            raise ConfigError(f"trainer.strategy={self.name} cannot restart workers; use ddp with "
                              "trainer.max_restarts (fw's launcher) for restarts")
        return SpawnLauncher(len(self.devices), self.start_method)
