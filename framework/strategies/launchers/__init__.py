"""Launchers: how a strategy's processes are started. A strategy returns one (or None); every
launcher has one method, ``launch(fn, *args)``: run one Trainer call as every rank of the job.

- ``ElasticLauncher`` (DDP over Gloo or NCCL; ``elastic.py``): re-runs the current command in one
  worker per device through torch's elastic agent (torchrun's engine); the launching process ends
  with the job's status (``JobEnded``).
- ``SpawnLauncher`` (``ddp_spawn``, ``ddp_notebook``; ``spawn.py``): runs the call in workers it
  starts from this process and returns rank 0's outcome.
- ``MPIExecLauncher`` (the mpi strategy; ``base.py``): MPI jobs are started by ``mpiexec``, so it
  refuses with the command to run.
- ``None``: one process, or the workers already exist (torchrun, srun, mpiexec).

Beside them: ``processes.py`` finds and ends the processes a launcher started, ``rendezvous.py``
the stores ranks meet through, ``worker_failures.py`` and ``failure_stamp.py`` a worker's error,
said once (``spawn_checks.py``: what ``ddp_spawn`` checks before it starts its workers).
"""

from framework.strategies.launchers.base import JobEnded, Launcher, MPIExecLauncher
from framework.strategies.launchers.elastic import ElasticLauncher, as_launcher_worker, current_command, launch_workers
from framework.strategies.launchers.spawn import SpawnLauncher

__all__ = ["ElasticLauncher", "JobEnded", "Launcher", "MPIExecLauncher", "SpawnLauncher", "as_launcher_worker",
           "current_command", "launch_workers"]
