"""Rank-zero helpers: do I/O once per job, never a collective inside them."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import logging

F = TypeVar("F", bound=Callable[..., Any])


def _rank_from_env() -> int:
    for key in ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"):
        value = os.environ.get(key)
        if value is not None and value.isdigit():
            return int(value)
    return 0


def global_rank() -> int:
    """This process's rank: the process group's when one exists, else the launcher's variables."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return _rank_from_env()


def rank_zero_only(fn: F) -> F:
    """Run ``fn`` on global rank 0 only; other ranks get ``None``.

    Never put a collective (barrier, all_reduce) inside such a function: the other ranks
    would not enter it and the job would hang.
    """

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if global_rank() == 0:
            return fn(*args, **kwargs)
        return None

    return wrapped  # type: ignore[return-value]


@rank_zero_only
def rank_zero_print(*args: Any, **kwargs: Any) -> None:
    """``print`` on rank 0: for what a command was asked to print (stdout is the user's)."""
    print(*args, **kwargs, flush=True)


def library_logger() -> logging.Logger:
    """The ``framework`` logger: INFO and up, one plain line each on stderr (set up once; it
    does not propagate to the root logger, so an application's logging setup shows each line
    once). Silence it with ``logging.getLogger("framework").setLevel(logging.WARNING)``."""
    import logging
    import sys

    log = logging.getLogger("framework")
    if not getattr(log, "_fw_configured", False):
        class CurrentStderr(logging.StreamHandler):
            """Writes to ``sys.stderr`` as it is at each message, not as it was at fw's first one
            (a ``redirect_stderr`` or a test's capture around that first message would keep the rest)."""

            @property
            def stream(self) -> Any:
                return sys.stderr

            @stream.setter
            def stream(self, _: Any) -> None:
                pass

        handler = CurrentStderr()
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        if log.level == logging.NOTSET:  # a level the program set before fw's first line stays
            log.setLevel(logging.INFO)
        log.propagate = False
        log._fw_configured = True  # type: ignore[attr-defined]  # a mark on the process-wide logger: set up once
    return log


@rank_zero_only
def rank_zero_info(message: str) -> None:
    """A library message on rank 0 (run summary, progress notes): stderr, through ``logging``."""
    library_logger().info(message)


class FwWarning(UserWarning):
    """fw's warnings: shown as one line, ``fw: warning: ...`` (no source line)."""


@rank_zero_only
def rank_zero_warn(message: str) -> None:
    """A warning on rank 0, through ``warnings`` (filters and ``pytest.warns`` work), shown as
    one line on stderr."""
    import warnings

    warnings.warn(message, FwWarning, stacklevel=3)


def _one_line_fw_warnings() -> None:
    """Show FwWarning as one line; every other warning as before. Installed when this module is
    imported (not at the first warning: inside ``catch_warnings(record=True)`` a hook installed
    then would take the warning away from the record)."""
    import warnings

    shown = warnings.showwarning
    if getattr(shown, "_fw_one_line", False):
        return

    def showwarning(message, category, filename, lineno, file=None, line=None):
        if isinstance(category, type) and issubclass(category, FwWarning):
            library_logger().warning(f"fw: warning: {message}")
            return
        shown(message, category, filename, lineno, file, line)

    showwarning._fw_one_line = True  # type: ignore[attr-defined]  # a mark on the hook: installed once
    warnings.showwarning = showwarning


_one_line_fw_warnings()
