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
failing worker ends the call with that worker's traceback.
"""

from __future__ import annotations

import os
import pickle
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from framework.environments import ClusterEnvironment
from framework.errors import ConfigError
from framework.strategies.ddp import DDPStrategy
from framework.strategies.launchers import Launcher
from framework.strategies.spawn_checks import first_failure, pickled_for_workers, record_failure, refuse_unguarded_main


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


class SpawnLauncher(Launcher):
    """Runs ``fn(*args)`` in ``nprocs`` workers it starts and returns rank 0's result."""

    def __init__(self, nprocs: int, start_method: str) -> None:
        self.nprocs, self.start_method = nprocs, start_method
        self.name = "ddp_notebook" if start_method == "fork" else "ddp_spawn"

    def launch(self, fn: Callable[..., Any], *args: Any) -> Any:
        import torch.multiprocessing as mp

        from framework import seed as fw_seed

        if self.start_method == "fork" and torch.cuda.is_available() and torch.cuda.is_initialized():
            raise ConfigError("trainer.strategy=ddp_notebook forks this process, but CUDA is already initialised "
                              "here (a CUDA context does not survive a fork); restart the notebook and create the "
                              "Trainer before any CUDA call, or use ddp_spawn from a script")
        out = tempfile.mkdtemp(prefix="fw-spawn-")  # rank 0 writes its result here (a pipe would
        results = os.path.join(out, "results.pt")   # fill up and block it before the join)
        snapshot = {"rng": fw_seed.get_rng_state(), "seed": fw_seed._seed,
                    "deterministic": torch.are_deterministic_algorithms_enabled()}
        # the rendezvous store lives here, on a port it holds from bind to end: no other job can
        # take it in between (the workers rendezvous through it as through torchrun's agent)
        store = dist.TCPStore("127.0.0.1", 0, self.nprocs, is_master=True, wait_for_workers=False)
        try:
            call: Any = (fn, args)
            if self.start_method == "spawn":
                refuse_unguarded_main(self.name)
                # by value: torch.multiprocessing's own pickler would put the tensors (the module's
                # parameters too) in memory that every worker shares, so each rank's optimizer
                # step would land on the same weights
                call = pickled_for_workers(fn, args, self.name)
            try:
                mp.start_processes(_worker, args=(call, self.nprocs, store.port, out, snapshot),
                                   nprocs=self.nprocs, join=True, start_method=self.start_method)
            except (mp.ProcessRaisedException, mp.ProcessExitedException) as err:
                raise first_failure(out, self.name) or err from None
            if not os.path.exists(results):
                raise RuntimeError(f"the {self.name} workers ended without rank 0's result")
            return torch.load(results, weights_only=False)
        finally:
            del store
            shutil.rmtree(out, ignore_errors=True)


def _worker(rank: int, call: Any, nprocs: int, port: int, out: str, snapshot: dict) -> None:
    try:
        _run_worker(rank, call, nprocs, port, out, snapshot)
    except BaseException as err:  # the caller raises the first rank's failure (others may only see its end)
        record_failure(out, rank, err)
        raise


def _run_worker(rank: int, call: Any, nprocs: int, port: int, out: str, snapshot: dict) -> None:
    from framework import seed as fw_seed

    fn, args = pickle.loads(call) if isinstance(call, bytes) else call
    fw_seed.set_rng_state(snapshot["rng"])
    fw_seed._seed = snapshot["seed"]
    torch.use_deterministic_algorithms(snapshot["deterministic"])
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCHELASTIC_USE_AGENT_STORE="True",
                      RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nprocs), LOCAL_WORLD_SIZE=str(nprocs),
                      OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nprocs))))
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    output = fn(*args)
    if rank == 0:
        torch.save(output, os.path.join(out, "results.pt"))
