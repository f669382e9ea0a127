"""The CPU each test costs, and the heaviest tests and files listed at the end of a run, beside
pytest's slowest durations.

On 2 cores the suite is CPU-bound (the cores are busy 87-99 % of a run), so what a test costs
the others is its CPU, not its wall time, which grows with whatever else runs beside it. A test
is charged its worker's CPU from the start of its set-up to the end of its teardown plus that of
the processes it started and waited for (``RUSAGE_CHILDREN``: children once reaped, with their
own reaped descendants). A module-scoped fixture is charged to the test that set it up, as
``--durations`` charges its time; the tasks of a SLURM job run under slurmd and are charged to
nobody. The header says what the whole run took besides (pytest's process and its reaped
children: under pytest-xdist, the workers, whose collection of every test and own bookkeeping no
test is charged).
"""

from __future__ import annotations

import resource
from collections import defaultdict

import pytest

KEY = "cpu_s"  # in each test's teardown report (travels from pytest-xdist's workers)
_START = pytest.StashKey[float]()
TESTS_SHOWN, FILES_SHOWN = 15, 10


def cpu_seconds() -> float:
    """This process's CPU and that of its reaped children, user and system."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def start(item: pytest.Item) -> None:
    item.stash[_START] = cpu_seconds()


def charge(item: pytest.Item, report: pytest.TestReport) -> None:
    """Put the test's CPU on its teardown report."""
    if report.when == "teardown" and _START in item.stash:
        report.user_properties.append((KEY, cpu_seconds() - item.stash[_START]))


def _charged(report: object) -> float | None:
    """The CPU a teardown report carries (None for other reports and entries)."""
    if getattr(report, "when", None) != "teardown":
        return None
    return dict(getattr(report, "user_properties", ())).get(KEY)


def summary(terminalreporter) -> None:
    charged = ((report.nodeid, _charged(report)) for reports in terminalreporter.stats.values() for report in reports)
    tests = {nodeid: seconds for nodeid, seconds in charged if seconds is not None}
    if not tests:
        return
    files: dict[str, float] = defaultdict(float)
    for nodeid, seconds in tests.items():
        files[nodeid.partition("::")[0]] += seconds
    write = terminalreporter.write_line
    terminalreporter.section(f"heaviest by CPU (the test's and its children's): {sum(tests.values()):.0f} s in all, "
                             f"of {cpu_seconds():.0f} s the whole run took")
    for nodeid, seconds in sorted(tests.items(), key=lambda kv: -kv[1])[:TESTS_SHOWN]:
        write(f"{seconds:7.1f} s  {nodeid}")
    write("files:")
    for path, seconds in sorted(files.items(), key=lambda kv: -kv[1])[:FILES_SHOWN]:
        write(f"{seconds:7.1f} s  {path}")
