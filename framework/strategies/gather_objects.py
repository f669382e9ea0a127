"""Gathering Python objects from every rank: pickled with CPU tensors as NumPy arrays, in one
collective when they are small.

``torch.distributed.all_gather_object`` pickles each tensor through ``torch.save`` and reads it
back through ``torch.load``: about 0.2 ms a tensor, and the per-rank states that a fit's end and
every checkpoint gather (RNG states, metric aggregates) hold several. A plain CPU tensor whose
dtype NumPy has goes as its array instead (a copy of its values: tensors that shared memory no
longer do); anything else (a tensor that needs grad, on a device, a subclass such as DTensor,
bfloat16) is pickled as torch pickles it.

``all_gather_object`` also sends the sizes first and the bytes after: two collectives, each a
wait for the slowest rank. ``all_gather`` here sends each rank's bytes in a buffer of a fixed
size with its length in front, one collective, when every rank's bytes fit (a fit's end and a
checkpoint gather a few kB a rank); when one rank's do not, every rank sees that from the
lengths and all take torch's way together.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import torch
import torch.distributed as dist

_AS_ARRAYS = {torch.float64, torch.float32, torch.float16, torch.int64, torch.int32, torch.int16, torch.int8,
              torch.uint8, torch.bool, torch.complex64, torch.complex128}


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is torch.Tensor and obj.device.type == "cpu" and obj.dtype in _AS_ARRAYS and not obj.requires_grad:
            return torch.from_numpy, (obj.contiguous().numpy(),)
        return NotImplemented


def dumps(obj: Any) -> bytes:
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buffer.getvalue()


def loads(data: bytes) -> Any:
    return pickle.loads(data)


#: bytes a rank may send in the one-collective gather (larger: torch's two rounds)
CAPACITY = 1 << 16
_LENGTH = 8  # the length in front of each rank's bytes: one int64


def all_gather(data: bytes, world_size: int, device: torch.device, group: Any = None) -> list[bytes]:
    """Every rank's ``data`` in rank order (call on every rank of ``group``)."""
    buffer = torch.zeros(_LENGTH + CAPACITY, dtype=torch.uint8)
    buffer[:_LENGTH] = torch.tensor([len(data)], dtype=torch.int64).view(torch.uint8)
    if data and len(data) <= CAPACITY:
        buffer[_LENGTH:_LENGTH + len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    buffer = buffer.to(device)
    out = [torch.empty_like(buffer) for _ in range(world_size)]
    dist.all_gather(out, buffer, group=group)
    lengths = [int(o[:_LENGTH].cpu().view(torch.int64)) for o in out]
    if max(lengths) > CAPACITY:
        whole: list[Any] = [None] * world_size
        dist.all_gather_object(whole, data, group=group)
        return whole
    return [bytes(o[_LENGTH:_LENGTH + n].cpu().numpy()) for o, n in zip(out, lengths, strict=True)]
