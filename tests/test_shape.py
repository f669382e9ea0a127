"""The package's shape stays as "How the code is laid out" in docs/contributing.md promises: no
file over 300 lines, no function over 60, every file opening with a docstring that says what it
holds, and no module outside ``framework/trainer/`` assigning an attribute of the Trainer."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "framework"
MAX_FILE_LINES, MAX_FUNCTION_LINES = 300, 60


@functools.cache  # one parse of the package for the four tests
def _files() -> list[tuple[str, ast.Module, int]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        found.append((str(path.relative_to(PACKAGE.parent)), ast.parse(text), text.count("\n")))
    return found


def test_no_file_is_long():
    long = [f"{name} ({lines} lines)" for name, _, lines in _files() if lines > MAX_FILE_LINES]
    assert not long, f"over {MAX_FILE_LINES} lines: " + ", ".join(long)


def test_no_function_is_long():
    long = [f"{name}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for name, tree, _ in _files() for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: " + ", ".join(long)


def test_every_file_says_what_it_holds():
    bare = [name for name, tree, lines in _files() if lines and not ast.get_docstring(tree)]
    assert not bare, "no module docstring: " + ", ".join(bare)


def _is_a_trainer(node: ast.expr) -> bool:
    """``trainer``, or ``self.trainer`` / ``run.trainer`` / ``module.trainer`` / ``pl_module.trainer``."""
    if isinstance(node, ast.Name):
        return node.id == "trainer"
    return (isinstance(node, ast.Attribute) and node.attr == "trainer" and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "run", "module", "pl_module"))


def _trainer_attributes_assigned(node: ast.AST) -> list[str]:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
        if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
    flat = [t for target in targets for t in (target.elts if isinstance(target, ast.Tuple) else [target])]
    return [t.attr for t in flat if isinstance(t, ast.Attribute) and _is_a_trainer(t.value)]


def _public_setters() -> set[str]:
    """The Trainer's properties that Lightning lets a callback set (``trainer.should_stop = True``)."""
    from framework import Trainer

    return {name for klass in Trainer.__mro__ for name, value in vars(klass).items()
            if isinstance(value, property) and value.fset is not None}


def test_only_the_trainer_package_sets_the_trainers_attributes():
    public = _public_setters()
    outside = [f"{name}:{node.lineno} trainer.{attr}" for name, tree, _ in _files()
               if not name.startswith("framework/trainer/") for node in ast.walk(tree)
               for attr in _trainer_attributes_assigned(node) if attr not in public]
    assert not outside, "a Trainer attribute assigned outside framework/trainer/: " + ", ".join(outside)
