"""``LocalEnvironment``: no launcher; this process is rank 0 of 1 and fw starts any workers."""

from __future__ import annotations

from collections.abc import Mapping

from framework.environments.base import ClusterEnvironment
from framework.environments.info import DistInfo


class LocalEnvironment(ClusterEnvironment):
    """The fallback: always detected, last in line.

    When the run asks for more than one device, the strategy's launcher
    (``framework/strategies/launchers/``) starts the workers itself, so ``launched_externally``
    is False.
    """

    name = "local"

    @staticmethod
    def detect(env: Mapping[str, str]) -> bool:
        return True

    def info(self) -> DistInfo:
        return DistInfo(source=self.name)

    @property
    def launched_externally(self) -> bool:
        return False

    def check(self, devices: int, num_nodes: int) -> None:
        """fw will start ``devices`` workers here: refuse if this is the batch shell of a
        multi-task SLURM job (those tasks belong to ``srun``; see ``check_slurm_batch_trap``)."""
        from framework.environments.slurm import check_slurm_batch_trap

        check_slurm_batch_trap(self.env, devices * num_nodes)
