"""The package's shape stays as "How the code is laid out" in docs/contributing.md promises:
every file opens with a docstring that says what it holds, and no module outside
``framework/trainer/`` changes the Trainer other than through its methods (an assignment,
``setattr``, a list's or dict's own change, or a helper that does one). Size is not capped here:
a file holds one concept, however long, and ruff's complexity rule (pyproject.toml's
``[tool.ruff.lint.mccabe]``, run by tests/test_lint.py) flags a function that branches too much."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "framework"


@functools.cache  # one parse of the package for the two tests
def _files() -> list[tuple[str, ast.Module, int]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        found.append((str(path.relative_to(PACKAGE.parent)), ast.parse(text), text.count("\n")))
    return found


def test_every_file_says_what_it_holds():
    bare = [name for name, tree, lines in _files() if lines and not ast.get_docstring(tree)]
    assert not bare, "no module docstring: " + ", ".join(bare)


def _is_a_trainer(node: ast.expr) -> bool:
    """``trainer``, or ``self.trainer`` / ``run.trainer`` / ``module.trainer`` / ``pl_module.trainer``."""
    if isinstance(node, ast.Name):
        return node.id == "trainer"
    return (isinstance(node, ast.Attribute) and node.attr == "trainer" and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "run", "module", "pl_module"))


def _trainer_path(node: ast.expr) -> list[str] | None:
    """``["state", "forward_only"]`` for ``trainer.state.forward_only`` (and ``trainer.x[i]``'s
    ``["x"]``); ``[]`` for the trainer itself; None for what is not reached from a trainer."""
    path: list[str] = []
    while not _is_a_trainer(node):
        if isinstance(node, ast.Attribute):
            path.insert(0, node.attr)
        elif not isinstance(node, ast.Subscript):
            return None
        node = node.value  # type: ignore[assignment]
    return path


#: the methods that change the list or dict they are called on
_MUTATING = {"append", "extend", "insert", "pop", "remove", "clear", "update", "setdefault", "popitem"}


def _trainer_writes(node: ast.AST, helpers: frozenset[str] | set[str] = frozenset()) -> list[str]:
    """What ``node`` writes of a trainer: ``trainer.a.b = ...`` (and ``+=``, ``trainer.a[k] = ...``),
    ``setattr(trainer.a, ...)``, ``object.__setattr__(trainer, ...)``, ``trainer.a.update(...)``
    (a list's or dict's own change), and a call of a helper in ``helpers`` given a trainer."""
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
        if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
    flat = [t for target in targets for t in (target.elts if isinstance(target, ast.Tuple) else [target])]
    paths = [_trainer_path(t) for t in flat if isinstance(t, (ast.Attribute, ast.Subscript))]
    found = [".".join(path) for path in paths if path]
    if isinstance(node, ast.Call):
        func, args = node.func, node.args
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name in ("setattr", "__setattr__", "delattr", "__delattr__") and args:
            path = _trainer_path(args[0])
            if path is not None:
                found.append(".".join([*path, "<setattr>"]))
        elif name in _MUTATING and isinstance(func, ast.Attribute):
            path = _trainer_path(func.value)
            if path:
                found.append(".".join([*path, f"{name}()"]))
        elif name in helpers and any(_trainer_path(arg) == [] for arg in [*args, *(k.value for k in node.keywords)]):
            found.append(f"<{name}()>")
    return found


def _public_setters() -> set[str]:
    """The Trainer's properties that Lightning lets a callback set (``trainer.should_stop = True``)."""
    from framework import Trainer

    return {name for klass in Trainer.__mro__ for name, value in vars(klass).items()
            if isinstance(value, property) and value.fset is not None}


def _writing_helpers() -> set[str]:
    """The functions of ``framework/trainer/`` (not the Trainer's methods) that write a trainer
    they are given: calling one from outside writes the Trainer as much as an assignment does."""
    return {node.name for name, tree, _ in _files() if name.startswith("framework/trainer/")
            for node in tree.body if isinstance(node, ast.FunctionDef)
            and any(_trainer_writes(inner) for inner in ast.walk(node))}


def test_only_the_trainer_package_sets_the_trainers_attributes():
    """Outside ``framework/trainer/`` a Trainer changes only through its own methods (and
    Lightning's public setters: ``trainer.should_stop = True``)."""
    public, helpers = _public_setters(), _writing_helpers()
    outside = [f"{name}:{node.lineno} trainer.{what}" for name, tree, _ in _files()
               if not name.startswith("framework/trainer/") for node in ast.walk(tree)
               for what in _trainer_writes(node, helpers) if what not in public]
    assert not outside, "a Trainer changed outside framework/trainer/: " + ", ".join(outside)
