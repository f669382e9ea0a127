"""``PassThroughProfiler``: what ``Trainer(profiler=None)`` holds. It records nothing, and the
Trainer, seeing it, times nothing: the hooks are called directly, with no wrapper per call."""

from __future__ import annotations

from framework.profilers.profiler import Profiler


class PassThroughProfiler(Profiler):
    """A profiler that does nothing (the Trainer's default, as in Lightning)."""

    def start(self, action_name: str) -> None:
        pass

    def stop(self, action_name: str) -> None:
        pass
