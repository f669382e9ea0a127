"""How ``MPIProcessGroup`` hands tensors to MPI: contiguous stand-ins for what MPI cannot take as
it is (non-contiguous tensors, dtypes MPI cannot reduce), ``Work`` objects that are already
complete, and the rule that a synchronous call first waits for the group's queued ones."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, Protocol, TypeVar

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future  # type: ignore[attr-defined]  # private torch API, not in its stubs

if TYPE_CHECKING:
    from framework.strategies.mpi.threads import CommThread

# dtypes that MPI cannot reduce directly (MPI has no bfloat16, no half arithmetic and no
# logical-as-arithmetic bool), mapped to the dtype the reduction runs in.
_REDUCE_AS = {torch.bfloat16: torch.float32, torch.float16: torch.float32, torch.bool: torch.int32}



def _done(result: Any) -> dist.Work:
    """A ``Work`` that is already complete, carrying ``result`` (a tensor or a list of them)."""
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


def _staged(t: torch.Tensor, dtype: torch.dtype | None = None, copy_in: bool = True) -> torch.Tensor:
    """``t`` itself when it is contiguous and of ``dtype``; else a contiguous stand-in (holding
    ``t``'s values when ``copy_in``) that the caller copies back into ``t`` when it is done."""
    if not t.is_cpu:
        raise ValueError(f"the fw_mpi backend handles CPU tensors only, got {t.device}")
    dtype = dtype or t.dtype
    if t.dtype == dtype and t.is_contiguous():
        return t
    return t.to(dtype).contiguous() if copy_in else torch.empty(t.shape, dtype=dtype)


class _Group(Protocol):
    """What ``_synchronous`` uses of the group: its communication thread and its watched call."""

    _thread: CommThread | None
    _run: Callable[..., Any]


_G = TypeVar("_G", bound=_Group)
_P = ParamSpec("_P")
_R = TypeVar("_R")


def _synchronous(what: str) -> Callable[[Callable[Concatenate[_G, _P], _R]], Callable[Concatenate[_G, _P], _R]]:
    """Run the decorated method after the group's queued calls, under its watchdog, named ``what``."""

    def wrap(method: Callable[Concatenate[_G, _P], _R]) -> Callable[Concatenate[_G, _P], _R]:
        @functools.wraps(method)
        def run(self: _G, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
            if self._thread is not None:
                self._thread.drain()
            return self._run(what, method, self, *args, **kwargs)

        return run

    return wrap
