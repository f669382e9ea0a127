"""Profilers: where a run's time goes, hook by hook (Lightning's ``Trainer(profiler=...)``).

``Trainer(profiler="simple")`` (``"advanced"``, ``"pytorch"``, a ``Profiler`` instance, or None
for none) times every hook the Trainer calls, the steps, the backward, the optimizer step and the
fetching of batches, under Lightning's action names (``timing.py``), and writes the report at
the end of each fit/validate/test/predict: to stderr on local rank 0, or with ``filename=`` to
``{dirpath}/{stage}-{filename}[-{local_rank}].txt`` on every rank (``dirpath`` defaults to the
run folder). Under DDP every rank profiles its own process.

- ``SimpleProfiler``: mean and total wall time, calls and share per action (``simple.py``);
- ``AdvancedProfiler``: ``cProfile`` statistics per action (``advanced.py``);
- ``PyTorchProfiler``: ``torch.profiler`` operators and a Chrome trace (``pytorch.py``).
"""

from __future__ import annotations

from typing import Any

from framework.errors import ConfigError
from framework.profilers.advanced import AdvancedProfiler
from framework.profilers.base import PassThroughProfiler
from framework.profilers.profiler import Profiler
from framework.profilers.pytorch import PyTorchProfiler
from framework.profilers.simple import SimpleProfiler

__all__ = ["AdvancedProfiler", "PassThroughProfiler", "Profiler", "PyTorchProfiler", "SimpleProfiler",
           "resolve_profiler"]

#: ``Trainer(profiler=name)``
PROFILERS: dict[str, type[Profiler]] = {"simple": SimpleProfiler, "advanced": AdvancedProfiler,
                                        "pytorch": PyTorchProfiler}


def resolve_profiler(profiler: Any, barebones: bool = False) -> Profiler:
    """What ``Trainer(profiler=...)`` holds: a name (``simple``, ``advanced``, ``pytorch``, any
    case), a ``Profiler``, or None (a ``PassThroughProfiler``, which times nothing). A recipe's
    mapping ``{_target_: framework.profilers.SimpleProfiler, filename: perf}`` is built by the
    recipe's runner (``framework/cli/run_recipe.py``), as its callbacks and loggers are.

    Raises:
        ConfigError: another value, or a profiler with ``barebones=True`` (Lightning's rule:
            barebones turns off everything that costs time per step).
    """
    if profiler is None:
        return PassThroughProfiler()
    if barebones:
        raise ConfigError(f"trainer.profiler={profiler!r} with trainer.barebones=true: barebones runs without "
                          "anything that costs time per step; drop one of the two")
    if isinstance(profiler, Profiler):
        return profiler
    if isinstance(profiler, str) and profiler.lower() in PROFILERS:
        return PROFILERS[profiler.lower()]()
    raise ConfigError(f"trainer.profiler={profiler!r}: use one of {', '.join(PROFILERS)}, a framework.profilers."
                      "Profiler, or in a recipe a mapping {_target_: framework.profilers.SimpleProfiler, filename: perf}")
