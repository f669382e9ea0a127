"""Sequence parallelism for ``fw.parallel.parallelize(..., sequence_parallel=True)``: between the
tensor-parallel pairs of a block, each rank holds its part of the sequence (dimension 1 of a
batch-first residual stream) instead of a full copy.

Where the activations change layout, over the tensor-parallel ranks:

- the first block's input (full on every rank) is cut to this rank's part of the sequence; its
  backward gathers the parts' gradients, so the embeddings before it see the full gradient;
- the block's norms run on their part (torch's ``SequenceParallel``: the weights are replicated
  ``DTensor``\\ s whose gradients are summed over the ranks);
- an attention or MLP gathers its input once (the norm's output, or the residual stream's part
  where no norm comes first) for all the layers that open its pair; the layer that closes the pair reduce-scatters its sums into sequence parts
  (``RowwiseParallel(output_layouts=Shard(1))``) where it would all-reduce them;
- the last block's output is gathered, so what follows the blocks (final norm, head, loss) sees
  the full sequence as without sequence parallelism.

Under activation checkpointing the first block is recomputed from the part its hook gave it,
which is not cut again.
"""

from __future__ import annotations

import functools
from typing import Any

from torch import Tensor, nn

from framework.errors import ConfigError
from framework.parallel.activation_checkpointing import recomputing

#: the dimension of a block's input and output that is split: (batch, sequence, width)
SEQUENCE_DIM = 1


def norms(block: nn.Module) -> dict[str, Any]:
    """``SequenceParallel`` for each of ``block``'s own norm layers (its children that are
    ``LayerNorm``, ``RMSNorm`` or of a class named ``...Norm``): they see the residual stream."""
    from torch.distributed.tensor.parallel import SequenceParallel

    return {name: SequenceParallel(sequence_dim=SEQUENCE_DIM) for name, child in block.named_children()
            if isinstance(child, (nn.LayerNorm, nn.RMSNorm)) or type(child).__name__.endswith("Norm")}


def gather_once(block: nn.Module, colwise: list[str], mesh: Any) -> None:
    """Gather the sequence at the input of each module that holds layers opening a pair (an
    attention's q, k, v), once for all of them rather than once per layer. Layers the block
    calls itself gather their own input (``ColwiseParallel(input_layouts=Shard(1))``)."""
    for parent in sorted({name.rpartition(".")[0] for name in colwise} - {""}):
        block.get_submodule(parent).register_forward_pre_hook(functools.partial(_replicate, mesh=mesh),
                                                              with_kwargs=True)


def split_between(first: nn.Module, last: nn.Module, mesh: Any) -> None:
    """Cut the sequence at ``first``'s input and gather it at ``last``'s output."""
    first.register_forward_pre_hook(functools.partial(_split, mesh=mesh), with_kwargs=True)
    last.register_forward_hook(functools.partial(_gather, mesh=mesh))


def _replicate(module: nn.Module, args: tuple, kwargs: dict, mesh: Any) -> tuple[tuple, dict]:
    """The inputs split by sequence, whole: a norm's output, and the first argument when it is a
    plain tensor (the residual stream's part that a block without a norm there passes on)."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    def whole(value: Any, first: bool = False) -> Any:
        if isinstance(value, DTensor):
            split = value.device_mesh == mesh and Shard(SEQUENCE_DIM) in value.placements
            return value.redistribute(mesh, [Replicate()]) if split else value
        if first and isinstance(value, Tensor):
            return DTensor.from_local(value, mesh, [Shard(SEQUENCE_DIM)], run_check=False).redistribute(
                mesh, [Replicate()])
        return value

    return tuple(whole(a, i == 0) for i, a in enumerate(args)), {k: whole(v) for k, v in kwargs.items()}


def _split(module: nn.Module, args: tuple, kwargs: dict, mesh: Any) -> tuple[tuple, dict]:
    from torch.distributed.tensor import DTensor, Replicate, Shard

    x = args[0] if args else None
    if recomputing(module):  # activation checkpointing: ``args`` are the part this hook gave the first time
        return args, kwargs
    size = mesh.size()
    if not isinstance(x, Tensor) or x.dim() < 2 or x.shape[SEQUENCE_DIM] % size:
        shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ConfigError(f"fw.parallel.parallelize(sequence_parallel=True): {type(module).__name__}'s input {shape} "
                          f"is not (batch, sequence, width) with a sequence that tensor_parallel_size={size} divides; "
                          f"give sequences of a multiple of {size} tokens, or leave sequence_parallel off")
    part = DTensor.from_local(x, mesh, [Replicate()], run_check=False).redistribute(mesh, [Shard(SEQUENCE_DIM)])
    return (part.to_local(), *args[1:]), kwargs


def _gather(module: nn.Module, args: tuple, output: Any, mesh: Any) -> Any:
    from torch.distributed.tensor import DTensor, Replicate, Shard

    def whole(part: Tensor) -> Tensor:
        return DTensor.from_local(part, mesh, [Shard(SEQUENCE_DIM)], run_check=False).redistribute(
            mesh, [Replicate()]).to_local()

    if isinstance(output, tuple) and output and isinstance(output[0], Tensor):  # (residual stream, extras)
        return (whole(output[0]), *output[1:])
    return whole(output)
