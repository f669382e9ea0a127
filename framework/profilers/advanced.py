"""``AdvancedProfiler``: Python's ``cProfile`` per action (Lightning's ``AdvancedProfiler``).

Each action has its own ``cProfile.Profile``, enabled while the action runs (starting one
disables the others, as in Lightning, so a nested action's time is not also counted in the
action around it). The report holds, per action, the ``pstats`` table sorted by cumulative
time; ``dump_stats=True`` also writes each action's raw stats as
``{dirpath}/{stage}-{filename}-{action}.prof`` (read them with ``pstats`` or snakeviz).
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
from collections import defaultdict
from pathlib import Path
from typing import Any

from framework.errors import ConfigError
from framework.profilers.profiler import Profiler


class AdvancedProfiler(Profiler):
    """Function-level statistics (``cProfile``) for every action. Verbose: use it to see
    which functions inside a slow hook take the time.

    Args:
        dirpath, filename: where the report goes (see ``Profiler``; default: the log).
        line_count_restriction: functions listed per action: a count (int) or a fraction of
            them (float in [0, 1]).
        dump_stats: also write each action's raw stats to ``.prof`` files in ``dirpath``.

    Raises:
        ValueError: an action stopped that was never started.
    """

    def __init__(self, dirpath: str | Path | None = None, filename: str | None = None,
                 line_count_restriction: float = 1.0, dump_stats: bool = False) -> None:
        super().__init__(dirpath=dirpath, filename=filename)
        self.profiled_actions: defaultdict[str, cProfile.Profile] = defaultdict(cProfile.Profile)
        self.line_count_restriction = line_count_restriction
        self.dump_stats = dump_stats

    def start(self, action_name: str) -> None:
        for profile in self.profiled_actions.values():
            profile.disable()
        self.profiled_actions[action_name].enable()

    def stop(self, action_name: str) -> None:
        profile = self.profiled_actions.get(action_name)
        if profile is None:
            raise ValueError(f"Attempting to stop recording an action ({action_name}) which was never started.")
        profile.disable()

    def summary(self) -> str:
        stats = {}
        for action, profile in self.profiled_actions.items():
            if self.dump_stats:
                self._dump(action, profile)
            text = io.StringIO()
            pstats.Stats(profile, stream=text).strip_dirs().sort_stats("cumulative").print_stats(
                self.line_count_restriction)
            stats[action] = text.getvalue()
        return self._stats_to_str(stats)

    def _dump(self, action: str, profile: cProfile.Profile) -> None:
        if not self.dirpath:
            raise ConfigError("AdvancedProfiler(dump_stats=True) has no folder to write to: give dirpath=")
        os.makedirs(self.dirpath, exist_ok=True)
        profile.dump_stats(os.path.join(self.dirpath, self._prepare_filename(action_name=action, extension=".prof")))

    def _writes_files(self) -> bool:
        return bool(self.filename) or self.dump_stats

    def teardown(self, stage: str | None) -> None:
        super().teardown(stage=stage)
        self.profiled_actions.clear()

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()  # a cProfile.Profile cannot be pickled: workers start with none
        state["profiled_actions"] = defaultdict(cProfile.Profile)
        return state
