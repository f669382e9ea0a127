"""ruff finds nothing in framework/, tests/, benchmarks/ and docs/, at the rules pyproject.toml
gives it (``[tool.ruff]``: import order, bugbear, complexity, simplifications, pytest style...):
the suite enforces them as much as CI's ``ruff check`` line (.ci/run) does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise",
                           "framework", "tests", "benchmarks", "docs"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
