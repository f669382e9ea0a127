"""The collectives of ``MPIProcessGroup`` that exchange data rather than reduce it: all-gather,
gather, scatter and all-to-all (mixed into the group; the rules are ``process_group.py``'s)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from framework.strategies.mpi.staging import _done, _staged, _synchronous

if TYPE_CHECKING:
    from torch._C._distributed_c10d import AllgatherOptions, AllToAllOptions, GatherOptions, ScatterOptions

    from framework.strategies.mpi.threads import CommThread


class ExchangeCollectives:
    """Mixed into ``MPIProcessGroup``: uses its ``comm``, ``_rank``, ``_size`` and ``_buf`` (and,
    through ``_synchronous``, its ``_thread`` and ``_run``). The collectives take c10d's
    ``(tensors, opts)`` form (see ``MPIProcessGroup``)."""

    comm: Any
    _rank: int
    _size: int
    _thread: CommThread | None
    _run: Callable[..., Any]

    _in_place: Any

    def _buf(self, t: torch.Tensor) -> list:
        raise NotImplementedError

    @_synchronous("all-gather")
    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: AllgatherOptions | None = None
                          ) -> dist.Work:
        if output.numel() != input.numel() * self._size:
            raise ValueError("all_gather_into_tensor: output must hold world_size * input.numel()")
        if _is_own_slot(input, output, self._rank):  # FSDP gathers in place: MPI wants IN_PLACE then
            self.comm.Allgather(self._in_place, self._buf(output))
            return _done(output)
        if input.untyped_storage().data_ptr() == output.untyped_storage().data_ptr():
            input = input.clone()  # MPI refuses a send buffer inside the receive buffer
        send, buf = _staged(input.detach()), _staged(output, copy_in=False)  # names keep them alive
        self.comm.Allgather(self._buf(send), self._buf(buf))
        if buf is not output:
            output.copy_(buf)
        return _done(output)

    _allgather_base = all_gather_single

    @_synchronous("all-gather")
    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                  opts: AllgatherOptions | None = None) -> dist.Work:
        for outs, inp in zip(outputs, inputs, strict=True):
            flat = torch.empty((self._size, inp.numel()), dtype=inp.dtype)
            self.all_gather_single(flat, inp)
            for out, row in zip(outs, flat, strict=True):
                out.copy_(row.view(out.shape))
        return _done(outputs)

    @_synchronous("gather")
    def gather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: GatherOptions
               ) -> dist.Work:
        # Python-level hook only, like ``reduce``; ``outputs`` is empty except on the root.
        (inp,) = inputs
        is_root = self._rank == opts.rootRank
        flat = torch.empty((self._size, inp.numel()), dtype=inp.dtype) if is_root else None
        send = _staged(inp.detach())
        self.comm.Gather(self._buf(send), self._buf(flat) if flat is not None else None, root=opts.rootRank)
        if flat is not None:  # the root
            for out, row in zip(outputs[0], flat, strict=True):
                out.copy_(row.view(out.shape))
        return _done(outputs[0] if outputs else [])

    @_synchronous("scatter")
    def scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: ScatterOptions
                ) -> dist.Work:
        (out,) = outputs
        is_root = self._rank == opts.rootRank
        flat = _staged(torch.stack([t.detach().reshape(-1) for t in inputs[0]])) if is_root else None
        buf = _staged(out, copy_in=False)
        self.comm.Scatter(self._buf(flat) if flat is not None else None, self._buf(buf), root=opts.rootRank)
        if buf is not out:
            out.copy_(buf)
        return _done(outputs)

    @_synchronous("all-to-all")
    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: AllToAllOptions | None = None
                 ) -> dist.Work:
        flat_out = torch.empty(sum(t.numel() for t in outputs), dtype=outputs[0].dtype)
        flat_in = torch.cat([t.detach().reshape(-1) for t in inputs])
        self.alltoall_base(flat_out, flat_in, [t.numel() for t in outputs], [t.numel() for t in inputs])
        for out, chunk in zip(outputs, flat_out.split([t.numel() for t in outputs]), strict=True):
            out.copy_(chunk.view(out.shape))
        return _done(outputs)

    @_synchronous("all-to-all")
    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                      input_split_sizes: list[int], opts: AllToAllOptions | None = None) -> dist.Work:
        n = self._size
        send, row_in = _staged(input.detach()), input[0].numel() if input.dim() else 1
        row_out = output[0].numel() if output.dim() else 1

        def layout(splits: list[int], total_rows: int, row: int) -> tuple[list[int], list[int]]:
            counts = [s * row for s in splits] if splits else [total_rows // n * row] * n
            displs = [sum(counts[:i]) for i in range(n)]
            return counts, displs

        s_counts, s_displs = layout(input_split_sizes, input.shape[0] if input.dim() else 1, row_in)
        r_counts, r_displs = layout(output_split_sizes, output.shape[0] if output.dim() else 1, row_out)
        buf = _staged(output, copy_in=False)
        (s_mem, s_type), (r_mem, r_type) = self._buf(send), self._buf(buf)
        self.comm.Alltoallv([s_mem, (s_counts, s_displs), s_type], [r_mem, (r_counts, r_displs), r_type])
        if buf is not output:
            output.copy_(buf)
        return _done(output)

    all_to_all_single = alltoall_base


def _is_own_slot(input: torch.Tensor, output: torch.Tensor, rank: int) -> bool:
    """``input`` is ``output``'s rank-th slot (an all-gather in place), both contiguous on CPU."""
    return (input.dtype == output.dtype and input.is_cpu and output.is_cpu and input.is_contiguous()
            and output.is_contiguous() and input.data_ptr() == output.data_ptr() + rank * input.nbytes)
