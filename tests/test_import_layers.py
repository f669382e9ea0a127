"""The package has no import cycle: following the imports every module makes when it is loaded
(not those under ``if TYPE_CHECKING:`` or inside functions), no module reaches itself."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "framework"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _load_time_imports(path: Path, known: set[str]) -> set[str]:
    """The framework modules ``path`` imports at load time (a package import loads its __init__)."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in tree.body:  # top level only: functions import late, TYPE_CHECKING never
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        for sub in ast.walk(node) if not isinstance(node, (ast.FunctionDef, ast.ClassDef)) else ():
            names = []
            if isinstance(sub, ast.Import):
                names = [alias.name for alias in sub.names]
            elif isinstance(sub, ast.ImportFrom) and sub.module and sub.level == 0:
                names = [sub.module] + [f"{sub.module}.{alias.name}" for alias in sub.names]
            for name in names:
                while name and name not in known:
                    name = name.rpartition(".")[0]
                if name:
                    found.add(name)
    return found


def _parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _graph() -> dict[str, set[str]]:
    """module -> the modules loading it loads first: what it imports, and their packages (an
    ``import a.b.c`` runs ``a/__init__`` and ``a/b/__init__`` first, unless the importer is in
    them already, which are then loading)."""
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    known = set(files)
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        mine = set(_parents(name))
        deps = set()
        for dep in _load_time_imports(path, known) - {name}:
            deps.add(dep)
            deps.update(p for p in _parents(dep) if p not in mine and p != name and p in known)
        graph[name] = deps - mine
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_module_imports_itself_through_others():
    cycle = _cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)
