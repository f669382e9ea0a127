"""Python objects as bytes for a gather, with CPU tensors pickled as NumPy arrays.

``torch.distributed.all_gather_object`` pickles each tensor through ``torch.save`` and reads it
back through ``torch.load``: about 0.2 ms a tensor, and the per-rank states that a fit's end and
every checkpoint gather (RNG states, metric aggregates) hold several. A plain CPU tensor whose
dtype NumPy has goes as its array instead (a copy of its values: tensors that shared memory no
longer do); anything else (a tensor that needs grad, on a device, a subclass such as DTensor,
bfloat16) is pickled as torch pickles it.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import torch

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
