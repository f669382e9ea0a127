"""The test tiers, marked at collection time (``pytest_collection_modifyitems`` in conftest.py).

- ``procs``: the test starts processes (2-rank Gloo jobs, fw's launcher, torchrun, mpiexec, the
  ``fw`` command, ``ddp_spawn``, any ``python -c``, copies forked by tests/forked.py). Most of
  the suite's time goes here.
- ``cluster``: it needs a SLURM cluster (every ``slurm`` test) or builds one of its own from
  network namespaces (``pytestmark = pytest.mark.cluster`` in its module).
- the fast tier: ``pytest -m "not procs and not cluster"``, everything in one process.

A test is marked ``procs`` when its function, one of its fixtures, or a helper they call refers to
something that starts a process (``subprocess.run``, ``Popen``, ``multiprocessing.Process``,
``torch.multiprocessing.spawn``, ``os.fork``, ...). Helpers are followed through the names their code refers to,
as far as they are defined under tests/ (``run_script`` in distributed/helpers.py, a module's own
``_run``); framework code is not followed. What this misses (a Trainer that launches workers from
inside the test's process) the guard in guards.py catches the first time it runs: it fails a test
that starts a process unmarked, and the fix is ``@pytest.mark.procs`` on that test.

The suite runs on 3 workers (pytest-xdist, ``-n 3 --dist loadfile`` in pyproject.toml): most
multi-process tests wait (on a timeout, a restart, a peer), so others fit beside them on 2 cores
(7:36 on 3 workers where 2 took 9:15, the same 624 tests; 4 took longer than 3, 10:39 against
10:15-10:27 for 867 tests on 2026-12-05, with the cores already busy 99 % of the time on 3). Files go out heaviest first (``heaviest_files_first``), so that the last file to start is a
short one and no worker finishes minutes before the other.
"""

from __future__ import annotations

import dis
import importlib
import importlib.util
import inspect
import multiprocessing
import os
import subprocess
import sys
import types
from functools import cache
from pathlib import Path

import pytest
import torch.multiprocessing

TESTS = Path(__file__).resolve().parent

#: modules, and the names in them that start a process (``subprocess.run``, also imported locally)
STARTING_NAMES = {
    "subprocess": {"run", "Popen", "call", "check_call", "check_output", "getoutput", "getstatusoutput"},
    "multiprocessing": {"Process", "Pool", "get_context"},
    "os": {"system", "popen", "fork", "forkpty", "posix_spawn", "posix_spawnp"},
}
#: the same callables, for a test module that imported them by name (``from subprocess import run``)
STARTERS = {getattr(module, name) for module in (subprocess, multiprocessing, os)
            for name in STARTING_NAMES[module.__name__] if hasattr(module, name)}
STARTERS |= {torch.multiprocessing.spawn, torch.multiprocessing.start_processes}


def mark_tiers(items: list[pytest.Item]) -> None:
    """Add ``procs`` and ``cluster`` to the tests that need them."""
    for item in items:
        if item.get_closest_marker("slurm") and not item.get_closest_marker("cluster"):
            item.add_marker(pytest.mark.cluster)
        if not item.get_closest_marker("procs") and _starts_processes(item):
            item.add_marker(pytest.mark.procs)


def heaviest_files_first(items: list[pytest.Item], default_timeout: float) -> None:
    """Reorder ``items`` (in place) file by file, the heaviest file first; within a file, and
    between files of equal weight, the order stays. A file's weight is the sum of its
    multi-process tests' timeouts (each slow test carries one about 3x its time; the others get
    ``default_timeout``): an estimate that needs no record of earlier runs. In-process tests
    weigh nothing, so they come last and fill the gaps."""
    weight: dict[str, float] = {}
    for item in items:
        if item.get_closest_marker("procs") or item.get_closest_marker("cluster"):
            mark = item.get_closest_marker("timeout")
            seconds = float(mark.args[0]) if mark and mark.args else default_timeout
        else:
            seconds = 0.0
        weight[item.nodeid.partition("::")[0]] = weight.get(item.nodeid.partition("::")[0], 0.0) + seconds
    items.sort(key=lambda item: -weight[item.nodeid.partition("::")[0]])


def _starts_processes(item: pytest.Item) -> bool:
    functions = [getattr(item, "obj", None)]
    fixtureinfo = getattr(item, "_fixtureinfo", None)
    if fixtureinfo is not None:
        functions += [d.func for defs in fixtureinfo.name2fixturedefs.values() for d in defs]
    return any(_refers_to_a_starter(f) for f in functions if f is not None)


def _refers_to_a_starter(obj: object) -> bool:
    return _follow(obj, anywhere=True)


@cache
def _defined_in_tests(filename: str | None) -> bool:
    return filename is not None and Path(filename).resolve().is_relative_to(TESTS)


def _follow(target: object, anywhere: bool = False) -> bool:
    """Whether a function or class defined under tests/ (or, with ``anywhere``, any function)
    refers to a starter; anything else is not followed."""
    if isinstance(target, type):
        module = sys.modules.get(target.__module__)
        return _defined_in_tests(getattr(module, "__file__", None)) and any(
            _follow(member) for member in vars(target).values() if inspect.isfunction(member))
    target = getattr(target, "__func__", target)  # a method
    if not inspect.isfunction(target):
        return False
    target = inspect.unwrap(target)
    code = getattr(target, "__code__", None)
    if not isinstance(code, types.CodeType) or not (anywhere or _defined_in_tests(code.co_filename)):
        return False
    return _code_starts(code, target.__globals__)


@cache
def _test_module(name: str, package: str | None = None) -> types.ModuleType | None:
    """The module under tests/ that ``import name`` inside a function gives, or None; a relative
    import (``from .helpers import x``) is tried in the function's package. A module not imported
    yet is imported now, unless its file is already loaded under another name (``toy`` and
    ``tests.toy``): a second copy would run its module-level code again."""
    if package:
        found = _test_module(f"{package}.{name}" if name else package)
        if found is not None or not name:
            return found
    if name in sys.modules:
        module = sys.modules[name]
        return module if _defined_in_tests(getattr(module, "__file__", None)) else None
    try:
        top = importlib.util.find_spec(name.partition(".")[0])  # a top-level name: imports nothing
        if top is None or not _defined_in_tests(top.origin or next(iter(top.submodule_search_locations or []), None)):
            return None
        spec = importlib.util.find_spec(name)  # imports the packages above it (tests/*/__init__.py)
    except (ImportError, ValueError):
        return None
    if spec is None or not _defined_in_tests(spec.origin):
        return None
    origin = Path(spec.origin).resolve()
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if file and _defined_in_tests(file) and Path(file).resolve() == origin:
            return module
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


_IMPORT_NAME = dis.opmap["IMPORT_NAME"]
_verdicts: dict[types.CodeType, bool] = {}


def _code_starts(code: types.CodeType, namespace: dict) -> bool:
    """Whether ``code`` (a function's, or one nested in it) refers to a starter, directly or
    through a function, class or module defined under tests/."""
    if code not in _verdicts:
        _verdicts[code] = False  # a helper that calls itself, or a cycle of them, stops here
        _verdicts[code] = _refers(code, namespace)
    return _verdicts[code]


def _refers(code: types.CodeType, namespace: dict) -> bool:
    names = set(code.co_names)
    for module, starting in STARTING_NAMES.items():  # subprocess.run, imported globally or locally
        if module in names and names & starting:
            return True
    imported = []  # modules imported inside the function; opcodes sit at the even bytes
    if _IMPORT_NAME in code.co_code[::2]:
        imported = [_test_module(i.argval, namespace.get("__package__"))
                    for i in dis.get_instructions(code) if i.opname == "IMPORT_NAME"]
    for target in [*(namespace.get(name) for name in names), *imported]:
        if any(target is starter for starter in STARTERS):
            return True
        if isinstance(target, types.ModuleType):  # helpers.run_script: the module's names
            if _defined_in_tests(getattr(target, "__file__", None)) and any(
                    _follow(getattr(target, n, None)) for n in names):
                return True
        elif target is not None and _follow(target):
            return True
    nested = (const for const in code.co_consts if isinstance(const, types.CodeType))
    return any(_code_starts(const, namespace) for const in nested)


def scale_timeouts(items: list[pytest.Item], default_timeout: float, factor: float) -> None:
    """Every test's pytest-timeout limit (its own mark, or the default) times ``factor``
    (tests/timescale.py): the mark put first is the one pytest-timeout reads."""
    if factor == 1.0:
        return
    for item in items:
        mark = item.get_closest_marker("timeout")
        seconds = float(mark.args[0]) if mark and mark.args else default_timeout
        item.add_marker(pytest.mark.timeout(seconds * factor), append=False)
