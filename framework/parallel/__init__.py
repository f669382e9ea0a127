"""Tensor parallel and FSDP for a standard transformer in one call, for ``configure_model``
under ``strategy="model_parallel"``::

    def configure_model(self):
        fw.parallel.parallelize(self.model, self.device_mesh, blocks={Block})

Inside each block, the linear layers that open a pair are split by output features
(``ColwiseParallel``: q, k, v and the MLP's first layers) and those that close it by input
features (``RowwiseParallel``: the attention's output projection and the MLP's last layer), so a
block's activations stay split between the two and are summed once at its end (Megatron's plan).
The layers are found by their names (``COLWISE``, ``ROWWISE``); ``plan`` names them where a model
calls them otherwise. Head counts (``HEAD_COUNTS``) are divided by the tensor-parallel size: a
standard block's attention reshapes with them (or with -1), never with the model width.

``loss_parallel=True`` also splits the output head by vocabulary (``HEADS``): its logits stay a
``DTensor`` sharded over the vocabulary and ``F.cross_entropy`` on them runs as
``torch.distributed.tensor.parallel.loss_parallel`` computes it, which the strategy enters around
every step and its backward; no rank ever holds the full logits.

``sequence_parallel=True`` also splits the activations between the blocks' pairs by sequence
(Megatron's sequence parallelism, as torchtitan's ``parallelize_llama``): the residual stream of
shape (batch, sequence, width) is split along dimension 1 at the first block's input and gathered
at the last block's output, the block's own norm layers (its children that are ``LayerNorm``,
``RMSNorm`` or of a class named ``...Norm``) run on their part of the sequence (``SequenceParallel``),
the input of the layers that open a pair is gathered once per attention or MLP and the layers that
close it reduce-scatter their sums back to sequence parts (instead of all-reducing them). The blocks
are taken to run one after the other in the order the model holds them, each returning the
residual stream, as a standard transformer's do; each rank's norms keep 1 / tensor-parallel size of
their activations for the backward. A layer that opens a pair and that the block calls itself (not
inside an attention or MLP) gathers its own input. ``loss_parallel`` goes with it (the head sees
the gathered sequence).

Over the data-parallel dimension (when it has more than one rank) every block and then the model
are sharded with ``fully_shard``: 2-D parallelism, FSDP over the replicas of the tensor-parallel
groups. Calling it again on a parallelized model does nothing (``configure_model`` runs for each
``fit``, ``validate``, ``test`` or ``predict`` call).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from torch import nn

from framework.errors import ConfigError, raised_alike_on_every_rank
from framework.parallel.blocks import class_names, units

__all__ = ["COLWISE", "FUSED", "HEADS", "HEAD_COUNTS", "ROWWISE", "layer_plan", "parallelize"]

#: layer names split by output features: the first layer of each pair
COLWISE = frozenset({"q", "k", "v", "wq", "wk", "wv", "query", "key", "value", "q_proj", "k_proj", "v_proj",
                     "fc", "fc1", "c_fc", "w1", "w3", "up_proj", "gate_proj", "up", "gate"})
#: layer names split by input features: the last layer of each pair
ROWWISE = frozenset({"o", "wo", "o_proj", "out_proj", "proj", "c_proj", "fc2", "w2", "down_proj", "down"})
#: one layer for q, k and v together: split by output features it would give a rank parts of each
FUSED = frozenset({"qkv", "c_attn", "in_proj", "wqkv", "qkv_proj"})
#: attention attributes that count heads: each rank computes heads / tensor-parallel size of them
HEAD_COUNTS = ("n_head", "n_heads", "num_heads", "n_kv_heads", "num_key_value_heads", "num_attention_heads")
#: names of the output head split by vocabulary with ``loss_parallel``
HEADS = ("lm_head", "head", "output")
#: set on a model whose head is split by vocabulary: steps run under ``loss_parallel``
LOSS_PARALLEL = "_fw_loss_parallel"
#: set on each block parallelize found (``trainer.compile`` compiles them one by one)
BLOCK = "_fw_block"


def parallelize(model: nn.Module, device_mesh: Any, blocks: Iterable[type[nn.Module] | str],
                plan: Mapping[str, str] | None = None, loss_parallel: bool = False,
                sequence_parallel: bool = False) -> nn.Module:
    """Tensor parallel inside each of ``model``'s ``blocks`` over ``device_mesh["tensor_parallel"]``,
    then FSDP over ``device_mesh["data_parallel"]``; returns ``model``.

    Args:
        model: the module whose ``forward`` the steps call (its parameters outside the blocks are
            sharded with the model, as FSDP's root).
        device_mesh: the strategy's 2-D mesh (``self.device_mesh`` in ``configure_model``).
        blocks: the transformer block classes (or their names).
        plan: ``{layer name inside a block: "colwise" | "rowwise"}`` for layers named otherwise
            than ``COLWISE``/``ROWWISE`` (or to override them).
        loss_parallel: split the output head (``HEADS``) by vocabulary too (see the module docstring).
        sequence_parallel: split the activations between the pairs by sequence too (idem).

    Raises:
        ConfigError: no block given or found, a linear layer the plan cannot place, a head count
            or a split layer's width the tensor-parallel size does not divide, a tied head under ``loss_parallel``; under
            ``sequence_parallel``, at the forward that meets it, a sequence length it does not divide.
    """
    from torch.distributed.fsdp import FSDPModule, fully_shard
    from torch.distributed.tensor import DTensor

    if any(isinstance(m, FSDPModule) for m in model.modules()) or any(
            isinstance(p, DTensor) for p in model.parameters()):
        return model  # parallelized by an earlier call
    key = "fw.parallel.parallelize(blocks=...)"
    names = class_names(blocks, key)
    if not names:
        raise ConfigError(f"{key}: no block class given; give the transformer block's class, e.g. blocks={{Block}}")
    found = units(model, names, key)
    for block in found:
        block.__dict__[BLOCK] = True
    tp, dp = device_mesh["tensor_parallel"], device_mesh["data_parallel"]
    plans = [(block, layer_plan(block, dict(plan or {}))) for block in found]  # refused before anything changes
    head = _vocab_head(model) if loss_parallel else None
    if tp.size() > 1:
        for block, kinds in plans:  # every block checked before any changes
            _divide_head_counts(block, tp.size(), apply=False)
            _divide_widths(block, kinds, tp.size())
        for block, kinds in plans:
            _divide_head_counts(block, tp.size())
            _split_block(block, kinds, tp, sequence_parallel)
        if sequence_parallel:
            from framework.parallel.sequence_parallel import split_between

            order = {id(m): i for i, m in enumerate(model.modules())}
            split_between(min(found, key=lambda m: order[id(m)]), max(found, key=lambda m: order[id(m)]), tp)
        if head is not None:
            _vocab_parallel_head(model, head, tp)
    if dp.size() > 1:
        for block in found:
            fully_shard(block, mesh=dp)
        fully_shard(model, mesh=dp)
    return model


def _split_block(block: nn.Module, kinds: dict[str, str], mesh: Any, sequence_parallel: bool) -> None:
    """Megatron's plan on one block; with ``sequence_parallel`` the pairs take and give back
    activations split by sequence, and the block's norms run on their part of it."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    between = Shard(1) if sequence_parallel else Replicate()  # the layout between the pairs
    # a layer inside an attention or MLP gets its input gathered already (gather_once): asked to
    # gather it again, its backward would all-reduce its own part of the gradient
    styles: dict[str, Any] = {name: ColwiseParallel(input_layouts=between if "." not in name else Replicate())
                              if kind == "colwise" else RowwiseParallel(output_layouts=between)
                              for name, kind in kinds.items()}
    if sequence_parallel:
        from framework.parallel.sequence_parallel import gather_once, norms

        styles.update(norms(block))
        gather_once(block, [name for name, kind in kinds.items() if kind == "colwise"], mesh)
    parallelize_module(block, mesh, styles)


def layer_plan(block: nn.Module, plan: dict[str, str]) -> dict[str, str]:
    """``{linear layer's name in block: "colwise" | "rowwise"}``: from ``plan``, else from the
    layer's name; a layer it cannot place, or a name in ``plan`` the block lacks, is refused."""
    kinds: dict[str, str] = {}
    for name, layer in block.named_modules():
        if not isinstance(layer, nn.Linear):
            continue
        last = name.rsplit(".", 1)[-1]
        kind = plan.get(name) or plan.get(last) or ("colwise" if last in COLWISE else "rowwise" if last in ROWWISE
                                                    else None)
        if kind is None:
            raise ConfigError(
                f"fw.parallel.parallelize: {type(block).__name__}.{name} is "
                + ("one layer for q, k and v: split by output features each rank would get parts of q, k and v, "
                   "not whole heads; make it three layers (q, k, v)" if last in FUSED else
                   "a linear layer whose name says neither where a pair opens (" + ", ".join(sorted(COLWISE)[:6])
                   + ", ...) nor where it closes (" + ", ".join(sorted(ROWWISE)[:6]) + ", ...); name it in "
                   f"plan={{'{name}': 'colwise' | 'rowwise'}}"))
        if kind not in ("colwise", "rowwise"):
            raise ConfigError(f"fw.parallel.parallelize: plan['{name}']={kind!r}; give 'colwise' or 'rowwise'")
        kinds[name] = kind
    missing = sorted(set(plan) - set(kinds) - {n.rsplit(".", 1)[-1] for n in kinds})
    if missing:
        layers = sorted(n for n, m in block.named_modules() if isinstance(m, nn.Linear))
        raise ConfigError(f"fw.parallel.parallelize: plan names {', '.join(missing)}, which {type(block).__name__} "
                          f"has no linear layer of; its linear layers: {', '.join(layers) or 'none'}")
    return kinds


def _divide_widths(block: nn.Module, kinds: dict[str, str], size: int) -> None:
    """Each split layer's split features (a colwise layer's outputs, a rowwise one's inputs) in
    equal parts: torch would shard them unevenly and fail in the forward ("Sharding propagation
    failed for aten.addmm"), naming no layer."""
    for name, kind in kinds.items():
        layer = block.get_submodule(name)
        assert isinstance(layer, nn.Linear)  # layer_plan places linear layers only
        features, which = (layer.out_features, "output") if kind == "colwise" else (layer.in_features, "input")
        if features % size:
            raise ConfigError(f"fw.parallel.parallelize: {type(block).__name__}.{name} ({kind}) has {features} {which} "
                              f"features, which tensor_parallel_size={size} does not divide; give it a width that "
                              f"{size} divides, or choose a tensor-parallel size that divides {features}")


@raised_alike_on_every_rank()  # the model the recipe builds, the same on every rank
def _divide_head_counts(block: nn.Module, size: int, apply: bool = True) -> None:
    for name, module in block.named_modules():
        for attr in HEAD_COUNTS:
            heads = getattr(module, attr, None)
            if not isinstance(heads, int) or isinstance(heads, bool):
                continue
            if heads % size:
                where = f"{type(block).__name__}.{name + '.' if name else ''}{attr}"
                raise ConfigError(f"fw.parallel.parallelize: {where}={heads} heads do not divide over "
                                  f"tensor_parallel_size={size}; choose a tensor-parallel size that divides {heads}")
            if apply:
                setattr(module, attr, heads // size)


@raised_alike_on_every_rank()
def _vocab_head(model: nn.Module) -> str:
    """The name of ``model``'s output head, which ``loss_parallel`` splits by vocabulary."""
    name = next((n for n in HEADS if isinstance(getattr(model, n, None), nn.Linear)), None)
    if name is None:
        raise ConfigError(f"fw.parallel.parallelize(loss_parallel=True): {type(model).__name__} has no linear output "
                          f"head named {', '.join(HEADS)}; name it so, or leave loss_parallel off")
    head = getattr(model, name)
    if any(head.weight is p for m in model.modules() if m is not head for p in m.parameters(recurse=False)):
        raise ConfigError(f"fw.parallel.parallelize(loss_parallel=True): {type(model).__name__}.{name}.weight is tied "
                          "to another layer's (the embedding's): split by vocabulary it cannot stay tied; untie it, "
                          "or leave loss_parallel off")
    return name


def _vocab_parallel_head(model: nn.Module, name: str, mesh: Any) -> None:
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    parallelize_module(model, mesh, {name: ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)})
    model.__dict__[LOSS_PARALLEL] = True
