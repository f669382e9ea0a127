"""``LocalEnvironment``: no launcher; this process is rank 0 of 1 and fw starts any workers."""

from __future__ import annotations

from collections.abc import Mapping

from framework.environments.base import ClusterEnvironment
from framework.environments.info import DistInfo


class LocalEnvironment(ClusterEnvironment):
    """The fallback: always detected, last in line.

    When the run asks for more than one device, the launcher (``framework/launch.py``) starts
    the workers itself, so ``launched_externally`` is False.
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
