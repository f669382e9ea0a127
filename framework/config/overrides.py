"""Command-line overrides of a recipe, as Hydra writes them:

- ``key=value`` sets a key (``module.lr=1e-3``); the value is read as the recipe's YAML reads it,
  so ``1e-3`` is the number it is in the file, not a string.
- ``~key`` removes a key: the module's own argument goes back to its default in the code, a
  Trainer argument to the Trainer's default, ``~callbacks.0`` drops the first callback.
- ``+key=value`` appends to a list (``+callbacks={_target_: framework.callbacks.EarlyStopping,
  monitor: val/loss}``; a list value appends each item) or adds a key the recipe does not have.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from framework.errors import ConfigError, first_line

if TYPE_CHECKING:
    from omegaconf import DictConfig


@dataclass(frozen=True)
class Override:
    op: str  # "set", "remove" or "append"
    key: str
    value: Any = None


def parse_override(item: str) -> Override:
    """``key=value``, ``~key`` or ``+key=value`` -> Override; ``key=`` is null."""
    from omegaconf import OmegaConf

    op = {"~": "remove", "+": "append"}.get(item[:1], "set")
    body = item[1:] if op != "set" else item
    if op == "remove":
        if "=" in body:
            raise ConfigError(f"override '{item}': write ~{body.split('=', 1)[0]} to remove a key (no value)")
        _check_key(item, body)
        return Override(op, body)
    if "=" not in body:
        raise ConfigError(f"override '{item}' has no '='; write key=value (e.g. trainer.max_epochs=5), "
                          "~key to remove a key or +key=value to append to a list")
    key, text = body.split("=", 1)
    _check_key(item, key)
    try:  # read as the recipe file is read (OmegaConf's YAML: 1e-3 is a float)
        parsed = OmegaConf.to_container(OmegaConf.from_dotlist([f"value={text}"]), resolve=False)
        value = parsed.get("value") if text and isinstance(parsed, dict) else None
    except Exception as err:
        raise ConfigError(f"override '{item}': the value is not valid YAML ({first_line(err)})") from None
    return Override(op, key, value)


def _check_key(item: str, key: str) -> None:
    if not key or not all(key.split(".")):
        raise ConfigError(f"override '{item}': '{key}' is not a dotted key like trainer.max_epochs")


def apply_override(merged: DictConfig, override: Override, free_form: bool, defaults: dict[str, Any]) -> None:
    """Change ``merged`` in place. ``free_form``: the key is the user's own (under module, data,
    callbacks, logger), so it may be added or deleted; ``defaults`` are the schema's defaults of
    the keys that may not be deleted (``trainer.max_epochs``, ``logger``, ...)."""
    from omegaconf import OmegaConf

    if override.op == "set":
        OmegaConf.update(merged, override.key, override.value, merge=False, force_add=free_form)
        return
    parent_key, _, last = override.key.rpartition(".")
    parent = OmegaConf.select(merged, parent_key) if parent_key else merged
    if override.op == "remove":
        _remove(parent, last, override.key, free_form, defaults)
        return
    current = OmegaConf.select(merged, override.key, default=_MISSING)
    if current is _MISSING or current is None:
        OmegaConf.update(merged, override.key, override.value, merge=False, force_add=free_form)
    elif OmegaConf.is_list(current):
        current.extend(override.value if isinstance(override.value, list) else [override.value])
    else:
        raise ConfigError(f"+{override.key}: '{override.key}' is already set and is not a list; "
                          f"write {override.key}=... to replace it")


_MISSING = object()


def _remove(parent: Any, last: str, key: str, free_form: bool, defaults: dict[str, Any]) -> None:
    from omegaconf import OmegaConf

    if key in defaults:
        OmegaConf.update(parent, last, defaults[key], merge=False)
        return
    if OmegaConf.is_list(parent) and last.isdigit() and int(last) < len(parent):
        del parent[int(last)]
        return
    if free_form and OmegaConf.is_dict(parent) and last in parent:
        del parent[last]
        return
    raise ConfigError(f"~{key}: the recipe has no key '{key}' to remove")


def schema_defaults(recipe_type: type, trainer_type: type) -> dict[str, Any]:
    """``{"trainer.max_epochs": None, "logger": True, ...}``: what ``~key`` puts back."""
    def default(f: dataclasses.Field) -> Any:
        if f.default_factory is not dataclasses.MISSING:
            return f.default_factory()
        return f.default

    values = {f.name: default(f) for f in dataclasses.fields(recipe_type) if f.name != "trainer"}
    values.update({f"trainer.{f.name}": default(f) for f in dataclasses.fields(trainer_type)})
    return values

