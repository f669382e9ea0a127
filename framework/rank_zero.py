"""Rank-zero helpers: do I/O once per job, never a collective inside them."""

from __future__ import annotations

import functools
import os
from typing import Any, Callable, TypeVar

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
    print(*args, **kwargs, flush=True)


@rank_zero_only
def rank_zero_warn(message: str) -> None:
    import warnings

    warnings.warn(message, stacklevel=3)
