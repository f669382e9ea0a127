"""An optimizer's saved state keyed by position (``Optimizer.state_dict()``, what DDP and one
process write) or by parameter name (``get_optimizer_state_dict``, what FSDP writes), turned
into the other, so that a checkpoint of either strategy resumes under the other.

Positions are the optimizer's own: its groups' parameters one after another. Names are the
module's (``named_parameters``), which FSDP keeps, so the same parameter has the same name under
both. A group of another length, or a name the module does not have, is refused with the names:
mapping it anyway would put one parameter's moments on another.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from framework.errors import CheckpointError


def keyed_by_name(state: dict) -> bool:
    """Does the saved state name its parameters (else it numbers them)?"""
    return any(isinstance(key, str) for group in state.get("param_groups", []) for key in group.get("params", []))


def to_names(state: dict, optimizer: Any, module: nn.Module, path: str) -> dict:
    """A positional state keyed by this optimizer's parameters' names."""
    names = _names(module)
    groups, moments = [], {}
    for saved, mine in _paired_groups(state, optimizer, path):
        keys = [names[id(param)] for param in mine["params"]]
        for index, name in zip(saved["params"], keys, strict=True):
            if index in state.get("state", {}):
                moments[name] = state["state"][index]
        groups.append({**saved, "params": keys})
    return {"state": moments, "param_groups": groups}


def to_positions(state: dict, optimizer: Any, module: nn.Module, path: str) -> dict:
    """A state keyed by names, numbered as this optimizer numbers its parameters."""
    names = _names(module)
    groups, moments, position = [], {}, 0
    for saved, mine in _paired_groups(state, optimizer, path):
        mine_names = [names[id(param)] for param in mine["params"]]
        if sorted(saved["params"]) != sorted(mine_names):
            missing = sorted(set(saved["params"]) ^ set(mine_names))
            raise CheckpointError(f"checkpoint '{path}': its optimizer state is for other parameters than "
                                  f"configure_optimizers() gave ({', '.join(missing[:4])}); resume with the model and "
                                  "optimizer it was written with")
        indices = list(range(position, position + len(mine_names)))
        for name, index in zip(mine_names, indices, strict=True):
            if name in state.get("state", {}):
                moments[index] = state["state"][name]
        groups.append({**saved, "params": indices})
        position += len(mine_names)
    return {"state": moments, "param_groups": groups}


def _names(module: nn.Module) -> dict[int, str]:
    """Each parameter's first name in module order, which ``get_optimizer_state_dict`` keys a
    tied parameter by (``emb.weight``, not ``head.weight``, when the head takes the embedding's)."""
    return {id(param): name for name, param in module.named_parameters()}


def _paired_groups(state: dict, optimizer: Any, path: str) -> list[tuple[dict, dict]]:
    saved, mine = state.get("param_groups", []), optimizer.param_groups
    lengths = [len(group["params"]) for group in saved], [len(group["params"]) for group in mine]
    if lengths[0] != lengths[1]:
        raise CheckpointError(f"checkpoint '{path}': its {type(optimizer).__name__} state has parameter groups of "
                              f"{lengths[0]} parameters, and configure_optimizers() made {lengths[1]}; resume with "
                              "the optimizer it was written with")
    return list(zip(saved, mine, strict=True))


def numbered(state: dict, optimizer: Any, module: nn.Module, path: str) -> dict:
    """``state`` as ``optimizer.load_state_dict`` takes it: numbered if it names its parameters."""
    return to_positions(state, optimizer, module, path) if keyed_by_name(state) else state
