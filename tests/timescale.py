"""How much slower this machine is than the one the suite's time limits were measured on.

Each slow test carries a timeout about 3x what it took (``@pytest.mark.timeout``), and the helpers
that start processes give them a deadline too (``run_cmd``, ``run_script``, the forked copies). Those
times were measured on one machine; this project's machines differ by 2x and more in speed (a
fresh interpreter's ``import torch``: 1.3 s on one, 2.5-3.7 s on another, and a CI run took
3.5x the time of the session before it for the same tests). A limit meant to catch a hang then
fails a test that was only slow.

So every limit is multiplied by one factor: ``FW_TEST_TIME_SCALE`` when set, else how much longer
than :data:`REFERENCE_S` a fresh interpreter takes here to import torch (never below 1). The
first pytest process measures it once and passes it to its workers in the environment.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

#: a fresh interpreter's ``import torch`` on the machine the limits were measured on (seconds)
REFERENCE_S = 1.4
VARIABLE = "FW_TEST_TIME_SCALE"


def measure() -> float:
    """The factor for this machine (set in the environment, so that workers and children agree)."""
    if VARIABLE not in os.environ:
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import torch"], check=False, timeout=120,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.environ[VARIABLE] = f"{max(1.0, (time.perf_counter() - start) / REFERENCE_S):.2f}"
    return factor()


def factor() -> float:
    return float(os.environ.get(VARIABLE, "1"))


def scaled(seconds: float) -> float:
    """A limit measured on the reference machine, for this one."""
    return seconds * factor()
