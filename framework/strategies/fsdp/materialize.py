"""A model built on the meta device, made real shard by shard after ``fully_shard``: no rank
ever holds the whole model in memory.

A module is built without memory under ``trainer.init_module()`` (Lightning's name; under
``fsdp`` it is ``torch.device("meta")``) or by its own ``configure_model()``. After sharding,
every rank allocates its shards (``to_empty``), and each module that owns meta tensors is
initialised by its ``reset_parameters()``: on a replica holding that module's own tensors at full
size, in CPU memory, one module at a time, with the RNG in the same state on every rank; each
rank then keeps its shard of the result. Drawn from the RNG state ``init_module`` ended with, in
module order, the initial weights are those the model would have had built eagerly (the draws of
building it, when its ``__init__`` seeds once before them, and when ``reset_parameters`` is all of
its initialisation: an ``nn.init`` its ``__init__`` applies afterwards was a no-op on the meta
device, and fw says so), and never each rank's own draw into its shard (DTensor's random ops on
a CPU mesh draw the same numbers into every shard). A module with
meta tensors and no ``reset_parameters`` cannot be initialised: it is refused by name (a
checkpoint load after it would do, but fw cannot tell a load will follow).

A tied parameter (a GPT's head taking its embedding's weight) is one tensor that several modules
own: every one of them draws in its ``reset_parameters`` (the draws building it made), and the
tensor keeps the values of the module that made it, as when built eagerly: the module that
registered it first under ``trainer.init_module()`` or in ``configure_model()``
(``recording_makers``), else (a model the user put on the meta device in ``__init__``) the first
of its owners in module order.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from framework.errors import ConfigError
from framework.rank_zero import rank_zero_info

#: the names under which a module holds a parameter another module made, in its ``__dict__``
_TAKEN = "_fw_taken_parameters"


@contextlib.contextmanager
def recording_makers() -> Iterator[None]:
    """While a model is built: each module notes the parameters it registers that another
    module registered first (made), so that a tied parameter is initialised by its maker (see
    the module docstring)."""
    from torch.nn.modules.module import register_module_parameter_registration_hook

    seen: dict[int, nn.Parameter] = {}  # held while building, so that no id is reused

    def note(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        taken = module.__dict__.setdefault(_TAKEN, set())
        if param is not None and id(param) in seen:
            taken.add(name)
        else:
            taken.discard(name)
            if param is not None:
                seen[id(param)] = param

    handle = register_module_parameter_registration_hook(note)
    try:
        yield
    finally:
        handle.remove()
        seen.clear()


def _own(module: nn.Module) -> list[tuple[str, Any]]:
    return [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]


def has_meta_tensors(module: nn.Module) -> bool:
    return any(t.is_meta for m in module.modules() for _, t in _own(m))


def materialize(root: nn.Module, device: torch.device, rng_state: torch.Tensor | None = None) -> None:
    """Allocate the sharded ``root``'s meta tensors on ``device`` and initialise them (see the
    module docstring) with the CPU RNG from ``rng_state`` (``trainer.init_module``'s, leaving
    the RNG as it is) or as it is now (a model built in ``configure_model``); nothing to do for a
    model built on a real device."""
    metas = [m for m in root.modules() if any(t.is_meta for _, t in _own(m))]
    built_on_meta = metas or has_meta_tensors(root)
    _refuse_meta_metrics(root, bool(built_on_meta))
    if not metas:
        return
    lacking = sorted({type(m).__name__ for m in metas if not callable(getattr(m, "reset_parameters", None))})
    if lacking:
        raise ConfigError(f"{', '.join(lacking)}: parameters on the meta device and no reset_parameters(), so fsdp "
                          "cannot initialise their shards; give the class a reset_parameters() that initialises its "
                          "own tensors, or build it on a real device")
    rank_zero_info("fw: the model was built on the meta device: each module is initialised by its "
                   "reset_parameters() after sharding (an initialisation its __init__ applied after building its "
                   "layers, such as nn.init on self.parameters(), was a no-op there: put it in reset_parameters)")
    for module in metas:  # only what is on the meta device: a metric's real state must stay as it is
        module.to_empty(device=device, recurse=False)
    makers = _makers(metas)
    with torch.no_grad(), torch.random.fork_rng(devices=[], enabled=rng_state is not None):
        if rng_state is not None:
            torch.set_rng_state(rng_state)
        for module in metas:
            others = {name for name, p in module._parameters.items() if makers.get(id(p), module) is not module}
            _initialise(module, others)


def _makers(modules: list[nn.Module]) -> dict[int, nn.Module]:
    """The module that made each parameter that several of ``modules`` own (module docstring)."""
    owners: dict[int, list[tuple[nn.Module, bool]]] = {}  # (module, took it from another)
    for module in modules:
        for name, param in module._parameters.items():
            if param is not None:
                owners.setdefault(id(param), []).append((module, name in module.__dict__.get(_TAKEN, ())))
    makers = {}
    for key, mine in owners.items():
        if len(mine) > 1:
            made = [m for m, took in mine if not took]
            makers[key] = (made or [m for m, _ in mine])[0]
    return makers


def _initialise(module: nn.Module, others: set[str]) -> None:
    """``module.reset_parameters()`` on a full-size CPU replica of its own tensors; each real
    tensor then takes its shard (or all of it, for an unsharded buffer), but for the tied
    parameters named in ``others``, which another module made."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    replica = copy.copy(module)  # the same attributes; its own tensors replaced below, children shared
    replica._parameters = {name: None if p is None else nn.Parameter(torch.empty(p.shape, dtype=p.dtype),
                                                                      requires_grad=p.requires_grad)
                           for name, p in module._parameters.items()}
    replica._buffers = {name: None if b is None else torch.empty(b.shape, dtype=b.dtype)
                        for name, b in module._buffers.items()}
    try:
        replica.reset_parameters()  # type: ignore[operator]
    except Exception as err:
        raise ConfigError(f"{type(module).__name__}.reset_parameters() on meta-built tensors failed "
                          f"({type(err).__name__}: {err}); build it on a real device") from None
    for name, real in _own(module):
        if name in others:
            continue
        full = replica._parameters.get(name) if name in module._parameters else replica._buffers.get(name)
        if full is None or real is None:
            continue
        if isinstance(real, DTensor):
            shard = distribute_tensor(full.detach(), real.device_mesh, real.placements, src_data_rank=None)
            real.to_local().copy_(shard.to_local())
        else:
            real.copy_(full.detach())


def _refuse_meta_metrics(root: nn.Module, built_on_meta: bool) -> None:
    """A torchmetrics metric built on the meta device has no values for its states (their
    defaults were never made): refused by name rather than filled with uninitialised memory."""
    if not built_on_meta:
        return
    for name, module in root.named_modules():
        defaults = getattr(module, "_defaults", None)
        if isinstance(defaults, dict) and any(getattr(v, "is_meta", False) for v in defaults.values()):
            raise ConfigError(f"{name or type(module).__name__} ({type(module).__name__}): a torchmetrics metric "
                              "built on the meta device has no starting values; create it outside "
                              "trainer.init_module() (in setup() or configure_model()), or build the model with "
                              "init_module(empty_init=False)")
