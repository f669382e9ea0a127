"""README.md is the front door: short, its two commands the ones CI runs, its links alive. (Its code
blocks run in tests/docsite/test_code_blocks.py, as every page of the docs does.)"""

from __future__ import annotations

import re

from conftest import ROOT
from docsite.blocks import blocks

README = (ROOT / "README.md").read_text()


def _commands(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip().startswith(("python3 -m venv", ".venv/bin/"))]


def test_the_readme_is_short():
    assert len(README.encode()) < 15_000, f"README.md is {len(README.encode())} bytes: move the detail into docs/"


def test_ci_runs_the_readmes_two_commands_first():
    readme = _commands(blocks(ROOT / "README.md")[0].body)
    assert len(readme) == 2, readme
    ci = _commands((ROOT / ".ci" / "run").read_text())
    assert ci[:2] == readme, f".ci/run starts with {ci[:2]}, README says {readme}"


def test_the_readmes_links_point_at_files_that_exist():
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README)
    assert targets
    missing = [t for t in targets if not t.startswith("http") and not (ROOT / t).exists()]
    assert not missing, missing
