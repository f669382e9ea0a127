"""framework/ is built in layers, written down once in pyproject.toml (``[tool.importlinter]``):
a package imports only the layers below its own, no two packages (or modules of one package)
import each other, and an import inside a function counts as much as one at the top of a file.
Import Linter checks the contracts; the second test shows it sees what the first relies on."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _lint(folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "import sys; from importlinter.cli import lint_imports; "
                           "sys.exit(lint_imports(no_cache=True, no_logo=True))"],
                          cwd=folder, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(folder)})


def test_framework_keeps_its_layers_and_has_no_circles():
    done = _lint(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr


def test_an_upward_import_inside_a_function_breaks_the_layers_and_one_for_annotations_does_not(tmp_path):
    (tmp_path / "pyproject.toml").write_text(textwrap.dedent("""\
        [tool.importlinter]
        root_package = "layered"
        exclude_type_checking_imports = true
        [[tool.importlinter.contracts]]
        name = "layers"
        type = "layers"
        containers = ["layered"]
        layers = ["high", "low"]
        """))
    package = tmp_path / "layered"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "high.py").write_text("from layered import low\n")
    (package / "low.py").write_text("from typing import TYPE_CHECKING\n"
                                    "if TYPE_CHECKING:\n    from layered.high import Thing\n")
    assert _lint(tmp_path).returncode == 0
    (package / "low.py").write_text("def late():\n    from layered import high\n")
    done = _lint(tmp_path)
    assert done.returncode == 1 and "layered.low -> layered.high" in done.stdout, done.stdout


def test_importing_the_recipe_code_does_not_load_the_trainer():
    """The recipe's schema is built from the Trainer's signature on first use, not at import."""
    done = subprocess.run([sys.executable, "-c", "import sys, framework.config; "
                           "print(sorted(m for m in sys.modules if m.startswith('framework')))"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    loaded = done.stdout
    assert done.returncode == 0 and "framework.config" in loaded, done.stderr
    assert "framework.trainer" not in loaded and "framework.strategies" not in loaded, loaded
