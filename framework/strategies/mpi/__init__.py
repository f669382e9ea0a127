"""``mpi``: DDP whose communication runs over MPI, under ``mpiexec``: ``MPIStrategy`` and the
abort of the whole job on one rank's error (``strategy.py``), and the ``fw_mpi`` process group
that carries it where torch has no MPI backend:

- ``backend.py``: registers the ``fw_mpi`` c10d backend and initialises the default group with it;
- ``process_group.py``: ``MPIProcessGroup``, the collectives over mpi4py (``exchange.py``: those
  that exchange rather than reduce; ``staging.py``: how tensors are handed to MPI);
- ``threads.py``: its watchdog and communication thread; ``rollcall.py``: which ranks a stuck
  collective waits for.
"""

from framework.strategies.mpi.strategy import MPIStrategy, abort_mpi_job

__all__ = ["MPIStrategy", "abort_mpi_job"]
