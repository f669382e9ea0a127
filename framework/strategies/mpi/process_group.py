"""``MPIProcessGroup``: a ``torch.distributed.ProcessGroup`` whose collectives run over mpi4py.

torch's CPU wheels carry no native MPI backend, so this class bridges c10d to an mpi4py
communicator: ``torch.distributed`` calls (and ``DistributedDataParallel``) land in the
methods below, which hand the tensors' memory to MPI (no copy, no numpy) and return ``Work``.
Registration and ``init_process_group`` live in ``backend.py``.

Rules that every method follows:

* CPU tensors only; results are written in place. A non-contiguous tensor (or one whose dtype
  MPI cannot reduce: bf16/fp16 are reduced in float32, bool in int32) is staged through a
  contiguous copy that is copied back before the call (or its ``Work``) completes.
* An all-reduce that the caller waits for later (``opts.asyncOp``: DDP's gradient buckets,
  ``dist.all_reduce(..., async_op=True)``) runs on the group's communication thread when the
  MPI library allows calls from several threads (``MPI_THREAD_MULTIPLE``, which mpi4py asks
  for by default): the call returns at once, and its ``Work`` (``wait()``, or the future DDP
  reads) completes once MPI is done and any staged copy is back. So DDP reduces one bucket
  while backward computes the next, as it does over Gloo and NCCL; MPI releases the GIL while
  it waits, so the autograd engine keeps computing. An error on that thread is raised by
  ``Work.wait()`` and the future (hence by DDP's backward). Below ``MPI_THREAD_MULTIPLE``
  (``MPI4PY_RC_THREAD_LEVEL=serialized``), or with ``overlap=False``, it runs synchronously.
* Every other call, and ``dist.all_reduce(..., async_op=False)``, is synchronous: it first
  waits for the group's queued all-reduces, then runs on the caller's thread, so each rank
  issues a communicator's collectives in the order the program called them (MPI's rule). A
  collective issued from a callback on a queued call's future (DDP comm hooks such as
  PowerSGD chain them) runs at once, right after its parent on every rank, provided the
  callback is attached before the next collective is issued (as comm hooks do).
* Point-to-point ``send``/``recv`` start a non-blocking MPI request and ``Work.wait()``
  completes it, so ``isend``/``irecv`` pairs in either order do not deadlock.
* MPI collectives have no timeout, so the group keeps its own: a watchdog thread says on stderr
  what a rank has been waiting for (every 30 s, or a third of the timeout) and aborts the MPI job once one call has
  waited longer than the group's timeout (a rank that stopped answering). It and the
  communication thread live in ``threads.py``; the staging rules in ``staging.py``;
  the collectives that exchange data (gather, scatter, all-to-all) in ``exchange.py``. A rank that
  raises aborts the job at once (``MPIStrategy.on_exception`` and the excepthook).

This relies on a private, experimental torch API (``_create_work_from_future``, Python
subclasses of ``ProcessGroup`` and ``Work``); ``tests/strategies/test_mpi_backend.py`` pins its behaviour.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PythonCallbackWork

from framework.strategies.mpi.exchange import ExchangeCollectives
from framework.strategies.mpi.rollcall import RollCall
from framework.strategies.mpi.staging import _REDUCE_AS, _done, _staged, _synchronous
from framework.strategies.mpi.threads import CommThread, Watchdog, call_unwatched

if TYPE_CHECKING:
    from torch._C._distributed_c10d import (
        AllreduceCoalescedOptions,
        AllreduceOptions,
        BarrierOptions,
        BroadcastOptions,
        ReduceOptions,
        ReduceScatterOptions,
    )

_RedOp = dist.ReduceOp.RedOpType


# The collectives take the form c10d's Python trampoline calls, ``(tensors, opts)``; torch's stubs
# list the Python-side overloads too (``allreduce(tensor, op, timeout)``, ...), which a Python
# ProcessGroup does not offer: those overrides are marked ``type: ignore[override]``, and those of
# the mixin (allgather, gather, scatter, the all-to-alls) ``type: ignore[misc]`` here.
class MPIProcessGroup(ExchangeCollectives, dist.ProcessGroup):  # type: ignore[misc]  # see above
    """A c10d process group over an mpi4py communicator (CPU tensors).

    Args:
        comm: the ``mpi4py.MPI.Comm`` the group uses; its rank and size are the group's.
        timeout: the longest one call may wait for the other ranks before the job is aborted
            (None: no bound, as MPI itself).
        overlap: run the all-reduces that the caller waits for later (DDP's) on a communication
            thread, overlapping backward. None: when the MPI library provides
            ``MPI_THREAD_MULTIPLE`` and the group has more than one rank. Kept as the attribute
            ``overlap``, which may be switched off at any time (to compare, say).

    Raises:
        ValueError: ``overlap=True`` but the MPI library was initialised without
            ``MPI_THREAD_MULTIPLE`` (the caller's thread may wait on a ``recv`` while the
            communication thread is inside a collective).
    """

    def __init__(self, comm: Any, timeout: timedelta | None = None, overlap: bool | None = None) -> None:
        # the stub knows ProcessGroup(store, rank, size) only; c10d also takes (rank, size)
        super().__init__(comm.Get_rank(), comm.Get_size())  # type: ignore[call-arg]
        from mpi4py import MPI

        threads = MPI.Query_thread() >= MPI.THREAD_MULTIPLE
        if overlap and not threads:
            raise ValueError("overlap=True needs an MPI library initialised with MPI_THREAD_MULTIPLE "
                             f"(this one provides level {MPI.Query_thread()}); HINT: leave overlap=None")
        self.comm, self._size = comm, comm.Get_size()
        self.overlap = threads and self._size > 1 if overlap is None else overlap
        self._in_place, self._from_address = MPI.IN_PLACE, MPI.buffer.fromaddress
        self._types = {
            torch.float32: MPI.FLOAT, torch.float64: MPI.DOUBLE,
            torch.complex64: MPI.C_FLOAT_COMPLEX, torch.complex128: MPI.C_DOUBLE_COMPLEX,
            torch.int8: MPI.INT8_T, torch.int16: MPI.INT16_T, torch.int32: MPI.INT32_T, torch.int64: MPI.INT64_T,
            torch.uint8: MPI.UINT8_T, torch.uint16: MPI.UINT16_T, torch.uint32: MPI.UINT32_T,
            torch.uint64: MPI.UINT64_T, torch.bool: MPI.C_BOOL,
            torch.bfloat16: MPI.INT16_T, torch.float16: MPI.INT16_T,  # moved as bits; reduced as _REDUCE_AS
        }  # fmt: skip
        # c10d's op (its int value: hashing the enum itself costs a microsecond) -> (MPI op, average)
        ops = dist.ReduceOp  # its members are RedOpType's (which the stub declares without them)
        self._ops = {op.value: (mpi_op, op == ops.AVG) for op, mpi_op in (
            (ops.SUM, MPI.SUM), (ops.AVG, MPI.SUM), (ops.PRODUCT, MPI.PROD),
            (ops.MIN, MPI.MIN), (ops.MAX, MPI.MAX),
            (ops.BAND, MPI.BAND), (ops.BOR, MPI.BOR), (ops.BXOR, MPI.BXOR),
        )}  # fmt: skip
        self._rank = comm.Get_rank()  # self.rank() is a C++ round trip
        self._group_name = ""  # until c10d names it (name_as)
        self._watchdog: Watchdog | None = None
        if timeout is not None and self._size > 1:
            self._watchdog = Watchdog(self._rank, self._size, timeout.total_seconds(),
                                      RollCall(comm) if threads else None)
        self._run: Callable[..., Any] = self._watchdog.watching if self._watchdog is not None else call_unwatched
        self._thread: CommThread | None = None  # started by the first asynchronous call
        self._starting = threading.Lock()
        self._completed = _done([])  # returned by every synchronous all-reduce: nobody reads it

    def getBackendName(self) -> str:  # name set by the C++ trampoline
        return "fw_mpi"

    def name_as(self, group_name: str) -> None:
        """c10d hands a Python group back as it is, without the name it gives every other group
        (the C++ name lives on a backend, and this group has none); a DeviceMesh (FSDP's) looks
        its groups up by that name."""
        self._group_name = group_name

    @property
    def group_name(self) -> str:  # type: ignore[override]
        return self._group_name

    def _buf(self, t: torch.Tensor) -> list:
        """The memory of a contiguous CPU tensor as an MPI buffer of its element type (no copy).

        The buffer holds no reference to ``t``: the caller keeps ``t`` alive until MPI is done.
        """
        try:
            return [self._from_address(t.data_ptr(), t.nbytes), self._types[t.dtype]]
        except KeyError:
            raise TypeError(f"the fw_mpi backend cannot move tensors of dtype {t.dtype}") from None

    def _check(self, t: torch.Tensor) -> None:
        if not t.is_cpu:
            raise ValueError(f"the fw_mpi backend handles CPU tensors only, got {t.device}")
        if t.dtype not in self._types:
            raise TypeError(f"the fw_mpi backend cannot move tensors of dtype {t.dtype}")

    def _issue(self, what: str, result: Any, call: Callable[..., Any], *args: Any) -> dist.Work:
        """Run ``call(*args)`` on the communication thread; its ``Work`` completes with ``result``."""
        if self._thread is None:
            with self._starting:  # two threads' first calls must not start two threads
                if self._thread is None:
                    self._thread = CommThread(self._run)
        if self._thread.is_current():  # issued by a completion callback: runs now, after its parent
            self._run(what, call, *args)
            return _done(result)
        return self._thread.submit(what, result, call, *args)

    # ---- reductions -------------------------------------------------------------------

    def _mpi_op(self, opts: AllreduceOptions | ReduceOptions | ReduceScatterOptions | None) -> tuple[Any, bool]:
        """(MPI op, whether to divide by the size afterwards) for c10d's ``opts.reduceOp``."""
        # ReduceOp object -> enum -> int (the stub's ReduceOp lacks .op, the enum)
        op = opts.reduceOp.op.value if opts is not None else dist.ReduceOp.SUM.value  # type: ignore[attr-defined]
        found = self._ops.get(op)
        if found is None:
            raise NotImplementedError(f"the fw_mpi backend does not support ReduceOp {_RedOp(op)}")
        return found

    def _reduce_into(self, out: torch.Tensor, src: torch.Tensor | None, mpi_op: Any, average: bool,
                     root: int | None = None) -> None:
        """All-reduce (``src`` and ``root`` None), reduce to ``root``, or reduce-scatter ``src``, into ``out``."""
        buf = _staged(out, _REDUCE_AS.get(out.dtype, out.dtype), copy_in=src is None)
        if src is not None:
            send = _staged(src.detach(), buf.dtype)
            self.comm.Reduce_scatter_block(self._buf(send), self._buf(buf), op=mpi_op)
        elif root is None:
            self.comm.Allreduce(self._in_place, self._buf(buf), op=mpi_op)
        else:  # only the root's tensor is defined afterwards
            sendbuf = self._in_place if self._rank == root else self._buf(buf)
            self.comm.Reduce(sendbuf, self._buf(buf), op=mpi_op, root=root)
        if average:
            if buf.is_floating_point() or buf.is_complex():
                buf.div_(self._size)
            else:  # integer mean truncates, as NCCL's does
                buf.copy_(torch.div(buf, self._size, rounding_mode="trunc"))
        if buf is not out:
            out.copy_(buf)

    def _allreduce(self, tensors: list[torch.Tensor], mpi_op: Any, average: bool) -> None:
        for t in tensors:
            if average or t.dtype in _REDUCE_AS or not (t.is_contiguous() and t.is_cpu):
                self._reduce_into(t, None, mpi_op, average)
            else:  # the common case, without the staging checks (a microsecond counts at 1 KB)
                self.comm.Allreduce(self._in_place, self._buf(t), op=mpi_op)

    def allreduce(self, tensors: list[torch.Tensor],  # type: ignore[override]  # c10d's (tensors, opts) only
                  opts: AllreduceOptions | None = None) -> dist.Work:
        mpi_op, average = self._mpi_op(opts)
        wait_later = opts is None or opts.asyncOp  # dist.all_reduce(async_op=False) waits at once
        if wait_later and self.overlap:
            for t in tensors:
                self._check(t)  # now: on the communication thread it would surface only at the wait
            return self._issue("all-reduce", tensors, self._allreduce, tensors, mpi_op, average)
        if self._thread is not None:
            self._thread.drain()
        self._run("all-reduce", self._allreduce, tensors, mpi_op, average)
        return _done(tensors) if wait_later else self._completed

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: AllreduceCoalescedOptions | None = None
                            ) -> dist.Work:
        return self.allreduce(tensors, opts)

    @_synchronous("reduce")
    def reduce(self, tensors: list[torch.Tensor], opts: ReduceOptions) -> dist.Work:  # type: ignore[override]  # c10d's (tensors, opts) only
        # Called by torch.distributed's Python functions only (no C++ trampoline hook).
        mpi_op, average = self._mpi_op(opts)
        for t in tensors:
            self._reduce_into(t, None, mpi_op, average, root=opts.rootRank)
        return _done(tensors)

    @_synchronous("reduce-scatter")
    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor,
                              opts: ReduceScatterOptions | None = None) -> dist.Work:
        self._reduce_into(output, input, *self._mpi_op(opts))
        return _done(output)

    # c10d passes the arguments by position; the stub names them outputTensor, inputTensor
    _reduce_scatter_base = reduce_scatter_single  # type: ignore[assignment]

    @_synchronous("reduce-scatter")
    def reduce_scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]],  # type: ignore[override]  # c10d's (tensors, opts) only
                       opts: ReduceScatterOptions | None = None) -> dist.Work:
        for out, chunks in zip(outputs, inputs, strict=True):
            self.reduce_scatter_single(out, torch.cat([c.reshape(-1) for c in chunks]), opts)
        return _done(outputs)

    # ---- data movement ----------------------------------------------------------------

    @_synchronous("broadcast")
    def broadcast(self, tensors: list[torch.Tensor],  # type: ignore[override]  # c10d's (tensors, opts) only
                  opts: BroadcastOptions | None = None) -> dist.Work:
        root = opts.rootRank if opts is not None else 0
        for t in tensors:
            buf = _staged(t)
            self.comm.Bcast(self._buf(buf), root=root)
            if buf is not t:
                t.copy_(buf)
        return _done(tensors)

    @_synchronous("barrier")
    def barrier(self, opts: BarrierOptions | None = None) -> dist.Work:  # type: ignore[override]  # c10d's (opts) only
        self.comm.Barrier()
        return _done([])

    # ---- point to point: non-blocking, completed by Work.wait() -------------------------

    def _p2p(self, start: Callable[[list], Any], t: torch.Tensor, receive: bool, what: str) -> dist.Work:
        buf = _staged(t, copy_in=not receive)
        request = start(self._buf(buf))  # the closure below keeps ``buf`` alive until the wait

        def wait(_timeout: timedelta | None) -> bool:
            self._run(what, request.Wait)
            if receive and buf is not t:
                t.copy_(buf)  # a staged receive
            return True

        return PythonCallbackWork(wait)

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> dist.Work:
        (t,) = tensors
        return self._p2p(lambda buf: self.comm.Isend(buf, dest=dst, tag=tag), t, receive=False,
                         what=f"send to rank {dst}")

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> dist.Work:
        (t,) = tensors
        return self._p2p(lambda buf: self.comm.Irecv(buf, source=src, tag=tag), t, receive=True,
                         what=f"receive from rank {src}")
