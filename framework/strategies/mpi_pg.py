"""``MPIProcessGroup``: a ``torch.distributed.ProcessGroup`` whose collectives run over mpi4py.

torch's CPU wheels carry no native MPI backend, so this class bridges c10d to an mpi4py
communicator: ``torch.distributed`` calls (and ``DistributedDataParallel``) land in the
methods below, which hand numpy views of the tensors to MPI and return already completed
``Work`` objects. Registration and ``init_process_group`` live in ``mpi_backend.py``.

Rules that every method follows:

* CPU tensors only; results are written in place. A non-contiguous tensor (or one whose dtype
  MPI cannot reduce: bf16/fp16 are reduced in float32, bool in int32) is staged through a
  contiguous copy that is copied back afterwards.
* Collectives are synchronous: the work is done when the method returns (no overlap of
  DDP's gradient all-reduce with backward). Point-to-point ``send``/``recv`` are the
  exception: they start a non-blocking MPI request and ``Work.wait()`` completes it, so
  ``isend``/``irecv`` pairs in either order do not deadlock.
* MPI collectives have no timeout, so the group keeps its own: a watchdog thread says on
  stderr what a rank has been waiting for (every 30 s) and aborts the MPI job once one call
  has waited longer than the group's timeout (a rank that stopped answering). A rank that
  raises aborts the job at once (``MPIStrategy.on_exception`` and the excepthook).

This relies on a private, experimental torch API (``_create_work_from_future``, Python
subclasses of ``ProcessGroup``); ``tests/strategies/test_mpi_backend.py`` pins its behaviour.
"""

from __future__ import annotations

import functools
import sys
import threading
import time
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PythonCallbackWork, _create_work_from_future

# dtypes that MPI cannot reduce directly (numpy has no bfloat16; MPI has no half or
# logical-as-arithmetic bool), mapped to the dtype the reduction runs in.
_REDUCE_AS = {torch.bfloat16: torch.float32, torch.float16: torch.float32, torch.bool: torch.int32}
# numpy has no bfloat16 at all: data movement (no arithmetic) goes through its bits.
_MOVE_AS = {torch.bfloat16: torch.int16}

_RedOp = dist.ReduceOp.RedOpType


def _done(result: Any) -> dist.Work:
    """A ``Work`` that is already complete, carrying ``result`` (a tensor or a list of them)."""
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


def _view(t: torch.Tensor):
    """Numpy view of a contiguous CPU tensor (bf16 reinterpreted as int16 bits)."""
    t = t.detach()
    if t.dtype in _MOVE_AS:
        t = t.view(_MOVE_AS[t.dtype])
    return t.numpy()


class _Staged:
    """Context: a contiguous tensor (of ``dtype``) standing in for ``t``; copied back on exit."""

    def __init__(self, t: torch.Tensor, dtype: torch.dtype | None = None, copy_in: bool = True):
        if t.device.type != "cpu":
            raise ValueError(f"the fw_mpi backend handles CPU tensors only, got {t.device}")
        self.t, dtype = t, dtype or t.dtype
        same = t.is_contiguous() and dtype == t.dtype
        if same:
            self.buf = t
        elif copy_in:
            self.buf = t.to(dtype).contiguous()
        else:
            self.buf = torch.empty(t.shape, dtype=dtype)

    def __enter__(self) -> torch.Tensor:
        return self.buf

    def __exit__(self, *exc) -> None:
        if exc[0] is None and self.buf is not self.t:
            self.t.copy_(self.buf)


class _Watchdog:
    """Bounds every MPI call of a group by ``timeout`` (MPI has no timeout of its own).

    The calls mark themselves busy (``watching``: two attribute writes, no lock); a daemon
    thread looks once a second, reports a wait every 30 s (or half the timeout) on stderr, and
    past the timeout aborts the whole MPI job: a rank that stopped answering (SIGSTOP, a
    dead node, a deadlock) would otherwise keep the others waiting forever.
    """

    def __init__(self, comm, timeout_s: float) -> None:
        self.comm, self.timeout_s = comm, timeout_s
        self.report_every = min(30.0, timeout_s / 2)
        self.what: str | None = None
        self.since = 0.0
        self._thread = threading.Thread(target=self._watch, name="fw-mpi-watchdog", daemon=True)
        self._thread.start()

    def watching(self, what: str, call: Callable[[], Any]) -> Any:
        if self.what is not None:  # a call made by another watched call
            return call()
        self.since = time.monotonic()  # before ``what``: the thread reads ``what`` first
        self.what = what
        try:
            return call()
        finally:
            self.what = None

    def _watch(self) -> None:
        seen, next_report = None, self.report_every
        while True:
            time.sleep(min(1.0, self.report_every / 2))
            what = self.what
            since = self.since
            if what is None:
                continue
            if (what, since) != seen:
                seen, next_report = (what, since), self.report_every
            waited = time.monotonic() - since
            where = f"rank {self.comm.Get_rank()} of {self.comm.Get_size()}"
            if waited > self.timeout_s:
                self._abort(f"fw: error: {where} waited {waited:.0f} s in MPI {what} for the other ranks "
                            f"(timeout {self.timeout_s:g} s, trainer.strategy.timeout): a rank stopped "
                            "answering; aborting the MPI job")
            if waited >= next_report:
                next_report += self.report_every
                sys.__stderr__.write(f"fw: {where} has waited {waited:.0f} s in MPI {what} for the other "
                                     f"ranks (aborting after {self.timeout_s:g} s, trainer.strategy.timeout)\n")
                sys.__stderr__.flush()

    def _abort(self, message: str) -> None:
        from mpi4py import MPI

        sys.__stderr__.write(message + "\n")
        sys.__stderr__.flush()
        time.sleep(0.5)  # let the launcher forward the line before the abort tears it down
        MPI.COMM_WORLD.Abort(1)


def _watched(what: str):
    """Run the decorated method under the group's watchdog (when it has one), named ``what``."""

    def wrap(method):
        @functools.wraps(method)
        def run(self, *args, **kwargs):
            if self._watchdog is None:
                return method(self, *args, **kwargs)
            return self._watchdog.watching(what, lambda: method(self, *args, **kwargs))

        return run

    return wrap


class MPIProcessGroup(dist.ProcessGroup):
    """A c10d process group over an mpi4py communicator (CPU tensors, synchronous collectives).

    Args:
        comm: the ``mpi4py.MPI.Comm`` the group uses; its rank and size are the group's.
        timeout: the longest one call may wait for the other ranks before the job is aborted
            (None: no bound, as MPI itself).
    """

    def __init__(self, comm, timeout: timedelta | None = None) -> None:
        super().__init__(comm.Get_rank(), comm.Get_size())
        from mpi4py import MPI

        self._MPI, self.comm = MPI, comm
        bounded = timeout is not None and comm.Get_size() > 1
        self._watchdog = _Watchdog(comm, timeout.total_seconds()) if bounded else None
        self._ops = {
            _RedOp.SUM: MPI.SUM, _RedOp.AVG: MPI.SUM, _RedOp.PRODUCT: MPI.PROD,
            _RedOp.MIN: MPI.MIN, _RedOp.MAX: MPI.MAX,
            _RedOp.BAND: MPI.BAND, _RedOp.BOR: MPI.BOR, _RedOp.BXOR: MPI.BXOR,
        }  # fmt: skip

    def getBackendName(self) -> str:  # noqa: N802 (name set by the C++ trampoline)
        return "fw_mpi"

    # ---- reductions -------------------------------------------------------------------

    def _mpi_op(self, reduce_op) -> tuple[Any, bool]:
        """(MPI op, whether to divide by the size afterwards) for c10d's ``opts.reduceOp``."""
        op = getattr(reduce_op, "op", reduce_op)  # opts carry a ReduceOp object; .op is the enum
        if op not in self._ops:
            raise NotImplementedError(f"the fw_mpi backend does not support ReduceOp {op}")
        return self._ops[op], op == _RedOp.AVG

    def _reduce_into(self, out: torch.Tensor, src: torch.Tensor | None, opts, kind: str) -> None:
        """All-reduce or reduce (``src`` None: in place), or reduce-scatter ``src``, into ``out``."""
        mpi_op, average = self._mpi_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        as_dtype = _REDUCE_AS.get(out.dtype, out.dtype)
        with _Staged(out, as_dtype, copy_in=src is None) as buf:
            if kind == "allreduce":
                self.comm.Allreduce(self._MPI.IN_PLACE, _view(buf), op=mpi_op)
            elif kind == "reduce":  # only the root's tensor is defined afterwards
                root = opts.rootRank
                send = self._MPI.IN_PLACE if self.rank() == root else _view(buf)
                self.comm.Reduce(send, _view(buf), op=mpi_op, root=root)
            else:
                send = src.detach().to(as_dtype).contiguous()
                self.comm.Reduce_scatter_block(_view(send), _view(buf), op=mpi_op)
            if average:
                if buf.is_floating_point() or buf.is_complex():
                    buf.div_(self.size())
                else:  # integer mean truncates, as NCCL's does
                    buf.copy_(torch.div(buf, self.size(), rounding_mode="trunc"))

    @_watched("all-reduce")
    def allreduce(self, tensors: list[torch.Tensor], opts=None) -> dist.Work:
        for t in tensors:
            self._reduce_into(t, None, opts, "allreduce")
        return _done(tensors)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts=None) -> dist.Work:
        return self.allreduce(tensors, opts)

    @_watched("reduce")
    def reduce(self, tensors: list[torch.Tensor], opts) -> dist.Work:
        # Called by torch.distributed's Python functions only (no C++ trampoline hook).
        for t in tensors:
            self._reduce_into(t, None, opts, "reduce")
        return _done(tensors)

    @_watched("reduce-scatter")
    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts=None):
        self._reduce_into(output, input, opts, "reduce_scatter")
        return _done(output)

    _reduce_scatter_base = reduce_scatter_single

    @_watched("reduce-scatter")
    def reduce_scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts=None):
        for out, chunks in zip(outputs, inputs):
            self.reduce_scatter_single(out, torch.cat([c.reshape(-1) for c in chunks]), opts)
        return _done(outputs)

    # ---- data movement ----------------------------------------------------------------

    @_watched("broadcast")
    def broadcast(self, tensors: list[torch.Tensor], opts=None) -> dist.Work:
        root = opts.rootRank if opts is not None else 0
        for t in tensors:
            with _Staged(t) as buf:
                self.comm.Bcast(_view(buf), root=root)
        return _done(tensors)

    @_watched("all-gather")
    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts=None) -> dist.Work:
        if output.numel() != input.numel() * self.size():
            raise ValueError("all_gather_into_tensor: output must hold world_size * input.numel()")
        send = input.detach().contiguous()
        with _Staged(output, copy_in=False) as buf:
            self.comm.Allgather(_view(send), _view(buf))
        return _done(output)

    _allgather_base = all_gather_single

    @_watched("all-gather")
    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts=None):
        for outs, inp in zip(outputs, inputs):
            flat = torch.empty((self.size(), inp.numel()), dtype=inp.dtype)
            self.all_gather_single(flat, inp)
            for out, row in zip(outs, flat):
                out.copy_(row.view(out.shape))
        return _done(outputs)

    @_watched("gather")
    def gather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts) -> dist.Work:
        # Python-level hook only, like ``reduce``; ``outputs`` is empty except on the root.
        (inp,) = inputs
        is_root = self.rank() == opts.rootRank
        flat = torch.empty((self.size(), inp.numel()), dtype=inp.dtype) if is_root else None
        self.comm.Gather(_view(inp.detach().contiguous()), _view(flat) if is_root else None, root=opts.rootRank)
        if is_root:
            for out, row in zip(outputs[0], flat):
                out.copy_(row.view(out.shape))
        return _done(outputs[0] if outputs else [])

    @_watched("scatter")
    def scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts) -> dist.Work:
        (out,) = outputs
        is_root = self.rank() == opts.rootRank
        flat = torch.stack([t.detach().reshape(-1) for t in inputs[0]]) if is_root else None
        with _Staged(out, copy_in=False) as buf:
            self.comm.Scatter(_view(flat) if is_root else None, _view(buf), root=opts.rootRank)
        return _done(outputs)

    @_watched("all-to-all")
    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts=None) -> dist.Work:
        flat_out = torch.empty(sum(t.numel() for t in outputs), dtype=outputs[0].dtype)
        flat_in = torch.cat([t.detach().reshape(-1) for t in inputs])
        self.alltoall_base(flat_out, flat_in, [t.numel() for t in outputs], [t.numel() for t in inputs])
        for out, chunk in zip(outputs, flat_out.split([t.numel() for t in outputs])):
            out.copy_(chunk.view(out.shape))
        return _done(outputs)

    @_watched("all-to-all")
    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        n = self.size()
        send, row_in = input.detach().contiguous(), input[0].numel() if input.dim() else 1
        row_out = output[0].numel() if output.dim() else 1

        def layout(splits, total_rows, row):
            counts = [s * row for s in splits] if splits else [total_rows // n * row] * n
            displs = [sum(counts[:i]) for i in range(n)]
            return counts, displs

        s_counts, s_displs = layout(input_split_sizes, input.shape[0] if input.dim() else 1, row_in)
        r_counts, r_displs = layout(output_split_sizes, output.shape[0] if output.dim() else 1, row_out)
        with _Staged(output, copy_in=False) as buf:
            self.comm.Alltoallv([_view(send), (s_counts, s_displs)], [_view(buf), (r_counts, r_displs)])
        return _done(output)

    all_to_all_single = alltoall_base

    @_watched("barrier")
    def barrier(self, opts=None) -> dist.Work:
        self.comm.Barrier()
        return _done([])

    # ---- point to point: non-blocking, completed by Work.wait() -------------------------

    def _p2p(self, start, t: torch.Tensor, receive: bool, what: str) -> dist.Work:
        staged = _Staged(t, copy_in=not receive)
        request = start(_view(staged.buf))  # the closure below keeps the buffer alive

        def wait(_timeout) -> bool:
            if self._watchdog is None:
                request.Wait()
            else:
                self._watchdog.watching(what, request.Wait)
            if receive:
                staged.__exit__(None, None, None)  # copy a staged receive back into ``t``
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
