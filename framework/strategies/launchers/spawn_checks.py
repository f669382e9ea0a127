"""What ``ddp_spawn`` checks before it starts fresh interpreters, so that a mistake is one line
naming the fix instead of Python's multiprocessing errors, and how a worker's failure reaches the
caller:

- the script's code that trains runs under ``if __name__ == "__main__":`` (each spawned worker
  imports the script, as Python's ``spawn`` start method does, and would run the fit again);
- the call pickles, and when it does not, which attribute is the one that does not;
- a worker that raises records its exception and traceback with the time; the caller raises the
  first one (``ddp_spawn`` and ``ddp_notebook``), not the error a peer met when it went away.
"""

from __future__ import annotations

import ast
import io
import pickle
import sys
from pathlib import Path
from types import FrameType
from typing import Any

from framework.errors import ConfigError, first_line
from framework.strategies.launchers.failure_stamp import FailureStamp, earliest_first


def refuse_unguarded_main(strategy: str) -> None:
    """A ConfigError when the line of the main script that led to this call is not inside an
    ``if __name__ == "__main__":`` block (nothing to check without a script file)."""
    import __main__

    path = getattr(__main__, "__file__", None)
    if not path:
        return
    frame: FrameType | None = sys._getframe(1)
    line = None
    while frame is not None:  # the outermost frame running the script's own top-level code
        if frame.f_code.co_name == "<module>" and frame.f_code.co_filename == path:
            line = frame.f_lineno
        frame = frame.f_back
    if line is None:
        return
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return
    statement = next((s for s in tree.body if s.lineno <= line <= (s.end_lineno or s.lineno)), None)
    if statement is None or _is_main_guard(statement):
        return
    raise ConfigError(
        f"trainer.strategy={strategy} starts fresh interpreters that each import {path}, which would run this "
        f"fit again (line {line} is not under a main guard): put the code that trains under "
        "`if __name__ == \"__main__\":`, or use strategy='ddp_notebook' (forked workers import nothing)")


def _is_main_guard(statement: ast.stmt) -> bool:
    if not isinstance(statement, ast.If) or not isinstance(statement.test, ast.Compare):
        return False
    test = statement.test
    names = [test.left, *test.comparators]
    return (len(names) == 2 and isinstance(test.ops[0], ast.Eq)
            and {_text(n) for n in names} == {"__name__", "__main__"})


def _text(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def pickled_for_workers(fn: Any, args: tuple, strategy: str) -> bytes:
    """``(fn, args)`` pickled for spawned workers, or a ConfigError that names the attribute (of
    the model, its data or the Trainer) that cannot be pickled."""
    try:
        return pickle.dumps((fn, args))
    except Exception as err:
        where, why = _culprit(fn, args) or ("the call", err)
        raise ConfigError(
            f"trainer.strategy={strategy} pickles the Trainer, the model and the data for its workers, and "
            f"{where} cannot be pickled ({type(why).__name__}: {first_line(why)}): define it at module level (a "
            "lambda, a local function or class, an open file or a lock cannot be pickled), let the workers "
            "build it, or use strategy='ddp_notebook' (forked workers need no pickling)") from None


def _culprit(fn: Any, args: tuple) -> tuple[str, BaseException] | None:
    """The model first, then the data, then the rest of the Trainer (where a user's own object
    that does not pickle most likely is): ``("Net.loss_fn", error)``."""
    call = args[0] if args else None
    model, datamodule = getattr(call, "model", None), getattr(call, "datamodule", None)
    parts = [(type(model).__name__, model), (type(datamodule).__name__, datamodule),
             ("the data", getattr(call, "loaders", None)), ("trainer", getattr(fn, "__self__", None))]
    seen: set[int] = set()
    for name, part in parts:
        found = _unpicklable(part, name, seen=seen) if part is not None else None
        if found is not None:
            return found
    return None


def _unpicklable(obj: Any, name: str, depth: int = 8, seen: set[int] | None = None) -> tuple[str, BaseException] | None:
    """The deepest attribute path under ``obj`` whose value does not pickle, and why."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return None
    seen.add(id(obj))
    try:
        pickle.dump(obj, io.BytesIO())
        return None
    except Exception as err:
        failure: tuple[str, BaseException] = (name, err)
    if depth == 0:
        return failure
    for child_name, child in _children(obj):
        deeper = _unpicklable(child, f"{name}{child_name}", depth - 1, seen)
        if deeper is not None:
            return deeper
    return failure


def _children(obj: Any) -> list[tuple[str, Any]]:
    if isinstance(obj, dict):
        return [(f"[{k!r}]", v) for k, v in obj.items()]
    if isinstance(obj, (list, tuple)):
        return [(f"[{i}]", v) for i, v in enumerate(obj)]
    state = getattr(obj, "__dict__", None)
    if not isinstance(state, dict):
        return []
    children = []
    for key, value in state.items():
        if key in ("_modules", "_parameters", "_buffers") and isinstance(value, dict):
            children += [(f".{k}", v) for k, v in value.items()]  # an nn.Module's parts, by their names
        else:
            children.append((f".{key}", value))
    return children


def record_failure(out: str, rank: int, err: BaseException) -> None:
    """In a worker: keep ``err`` (itself where it pickles) and its traceback for the caller."""
    stamp = FailureStamp.of(err)
    record = {"time": stamp.time, "rank": rank, "traceback": stamp.traceback, "error": err}
    try:
        data = pickle.dumps(record)
    except Exception:
        data = pickle.dumps({**record, "error": None})
    Path(out, f"failure-{rank}.pkl").write_bytes(data)


def first_failure(out: str, strategy: str) -> BaseException | None:
    """In the caller: the first worker failure (by time), as the exception that rank raised with
    its traceback as a note; None when no worker recorded one (it was killed)."""
    records = []
    for path in Path(out).glob("failure-*.pkl"):
        try:
            records.append(pickle.loads(path.read_bytes()))
        except Exception:
            continue
    if not records:
        return None
    first = earliest_first(records, lambda r: r["time"])[0]
    where = f"rank {first['rank']} of the {strategy} workers raised it; its traceback:\n{first['traceback'].rstrip()}"
    error = first["error"]
    if isinstance(error, BaseException) and hasattr(error, "add_note"):
        error.add_note(where)
        return error
    return RuntimeError(where)
