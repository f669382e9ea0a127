"""Load a recipe: read YAML, apply the overrides (``key=value``, ``~key``, ``+key=value``: see
overrides.py), check it against the schema.

Every mistake becomes a one-line ``ConfigError`` that names the key (with its full path) or the
file, and says how to fix it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from framework.config.coerce import PLAIN_NAMES, mismatch_message
from framework.config.overrides import apply_override, parse_override, schema_defaults
from framework.config.schema import recipe_config, trainer_config
from framework.errors import ConfigError, did_you_mean, first_line, raised_alike_on_every_rank

if TYPE_CHECKING:
    from omegaconf import DictConfig

#: Lightning 1.x's Trainer arguments that Lightning 2 (and fw) dropped, and what to write instead
LIGHTNING_1X_KEYS = {
    "gpus": "trainer.accelerator=gpu trainer.devices=N (Trainer(accelerator='gpu', devices=N))",
    "num_processes": "trainer.accelerator=cpu trainer.devices=N trainer.strategy=ddp_gloo",
    "tpus": "none: fw runs on CPU and CUDA devices (trainer.accelerator=cpu or gpu)",
    "ipus": "none: fw runs on CPU and CUDA devices (trainer.accelerator=cpu or gpu)",
    "resume_from_checkpoint": "ckpt_path=PATH (fw fit recipe.yaml ckpt_path=PATH; trainer.fit(model, ckpt_path=PATH))",
    "replace_sampler_ddp": "trainer.use_distributed_sampler",
    "weights_summary": "trainer.enable_model_summary",
    "checkpoint_callback": "trainer.enable_checkpointing",
    "reload_dataloaders_every_epoch": "trainer.reload_dataloaders_every_n_epochs=1",
    "progress_bar_refresh_rate": "trainer.enable_progress_bar (off: false)",
    "amp_backend": "trainer.precision=16-mixed (or bf16-mixed)",
    "auto_lr_find": "Tuner(trainer).lr_find(model) (framework.tuner), before fit",
    "auto_scale_batch_size": "Tuner(trainer).scale_batch_size(model) (framework.tuner), before fit",
    "stochastic_weight_avg": "+callbacks={_target_: framework.callbacks.StochasticWeightAveraging, swa_lrs: 0.01}",
}


@functools.cache
def _sections() -> frozenset[str]:
    """The recipe's top-level keys."""
    return frozenset(f.name for f in dataclasses.fields(recipe_config()))


@functools.cache
def _trainer_keys() -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(trainer_config()))


@functools.cache
def _defaults() -> Any:
    return schema_defaults(recipe_config(), trainer_config())


#: an OmegaConf resolver call (``${oc.env:HOME}``, ``${my_resolver:x}``), not a plain ``${a.b}``
_RESOLVER_CALL = re.compile(r"\$\{\s*[\w.]+\s*:")


def reads_environment(text: str) -> bool:
    """Whether a recipe's values may differ from process to process: a resolver (``oc.env``, or
    one of the user's) may read each node's own environment."""
    return _RESOLVER_CALL.search(text) is not None


def load_recipe(path: str | Path, overrides: Sequence[str] = ()) -> tuple[dict, str]:
    """Return the merged, checked recipe as plain containers, and its YAML text."""
    raw = _read_yaml(Path(path))  # a file: on one node it may be missing, so not marked alike
    alike = not reads_environment(Path(path).read_text() + "\n".join(overrides))
    with raised_alike_on_every_rank() if alike else contextlib.nullcontext():  # the text and the command line alone
        return _merge(path, raw, overrides)


def _merge(path: str | Path, raw: DictConfig, overrides: Sequence[str]) -> tuple[dict, str]:
    from omegaconf import DictConfig, OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    changes = [parse_override(item) for item in overrides]
    _check_keys(OmegaConf.to_container(raw), "recipe")
    for change in changes:
        _check_keys(_nest(change.key), "override")
    schema = OmegaConf.structured(recipe_config())
    try:
        merged = OmegaConf.merge(schema, raw)
        assert isinstance(merged, DictConfig), "a structured config merged with a mapping is one"
        for change in changes:  # in order: later overrides win
            _strategy_as_mapping(merged, change.key)
            apply_override(merged, change, _free_form(change.key), _defaults())
        plain = OmegaConf.to_container(merged, resolve=True)
    except OmegaConfBaseException as err:
        raise ConfigError(_explain(err)) from None
    assert isinstance(plain, dict), "a merged DictConfig becomes a dict"
    if not plain.get("module"):
        raise ConfigError(f"{path}: the recipe has no 'module' section; add module: {{_target_: pkg.Class, ...}}")
    for section in ("module", "data"):
        node = plain.get(section)
        if node is not None and not (isinstance(node, dict) and "_target_" in node):
            raise ConfigError(f"{section}: needs '_target_: package.module.Class' and its keyword arguments")
    return plain, OmegaConf.to_yaml(merged)


def _read_yaml(path: Path) -> DictConfig:
    from omegaconf import DictConfig, OmegaConf
    from yaml import YAMLError

    if path.is_dir():
        found = sorted(str(p) for p in path.glob("*.y*ml"))[:3]
        examples = f" ({', '.join(found)})" if found else ""
        raise ConfigError(f"recipe '{path}' is a directory; give the path of a YAML file in it{examples}")
    if not path.is_file():
        raise ConfigError(f"recipe '{path}' does not exist; give the path of a YAML file (e.g. conf/digits.yaml)")
    text = path.read_text()
    if not text.strip():
        raise ConfigError(f"recipe '{path}' is empty; it needs at least a 'module' section")
    try:
        raw = OmegaConf.create(text)
    except YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or first_line(err)
        raise ConfigError(f"recipe '{path}' is not valid YAML{where}: {problem}") from None
    except Exception as err:  # omegaconf wraps some YAML problems in its own errors
        raise ConfigError(f"recipe '{path}' cannot be read: {first_line(err)}") from None
    if not isinstance(raw, DictConfig):
        raise ConfigError(f"recipe '{path}' must be a mapping of sections (module, data, trainer, ...)")
    return raw


def _check_keys(tree: Any, where: str) -> None:
    """Unknown top-level and trainer keys, with a suggestion."""
    if not isinstance(tree, dict):
        return
    for key in tree:
        if key in LIGHTNING_1X_KEYS:  # `fw fit x.yaml gpus=1`: a Trainer argument of Lightning 1.x
            raise ConfigError(f"{where}: '{key}' is Lightning 1.x's Trainer argument; today's spelling: "
                              f"{LIGHTNING_1X_KEYS[key]}")
        if key not in _sections():
            raise ConfigError(
                f"{where}: unknown key '{key}'{did_you_mean(key, _sections())}; "
                f"top-level keys are {', '.join(sorted(_sections()))}"
            )
    trainer = tree.get("trainer")
    if isinstance(trainer, dict):
        for key in trainer:
            if key in ("logger", "callbacks"):
                example = "logger=false" if key == "logger" else "callbacks=[] or +callbacks={_target_: ...}"
                raise ConfigError(f"{where}: 'trainer.{key}' is a top-level key of the recipe: write "
                                  f"{key}=... (e.g. {example}), not trainer.{key}=...")
            if key in LIGHTNING_1X_KEYS:
                raise ConfigError(f"{where}: 'trainer.{key}' is Lightning 1.x's; today's spelling: "
                                  f"{LIGHTNING_1X_KEYS[key]}")
            if key not in _trainer_keys():
                raise ConfigError(
                    f"{where}: unknown key 'trainer.{key}'{did_you_mean(key, _trainer_keys())}; "
                    "the Trainer's keys are the arguments of framework.Trainer"
                )


def _nest(key: str) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    node = tree
    for part in key.split(".")[:-1]:
        node = node.setdefault(part, {})
    node[key.split(".")[-1]] = None
    return tree


def _strategy_as_mapping(merged: DictConfig, key: str) -> None:
    """``trainer.strategy=ddp_gloo trainer.strategy.timeout=60``: a named strategy that gets
    options becomes ``{name: ddp_gloo, timeout: 60}`` instead of losing its name."""
    if key.startswith("trainer.strategy.") and isinstance(merged.trainer.strategy, str):
        merged.trainer.strategy = {"name": merged.trainer.strategy}


def _free_form(key: str) -> bool:
    """Keys under module/data/callbacks/logger are the user's own; any may be added."""
    return key.split(".")[0] in ("module", "data", "callbacks", "logger") or key.startswith("trainer.strategy.")


def _explain(err: Exception) -> str:
    key = getattr(err, "full_key", None) or ""
    text = first_line(err)
    if "could not be converted" in text or "Invalid type" in text or "is not a subclass" in text:
        return mismatch_message(key, _expected_type(key), getattr(err, "value", None))
    return f"{key}: {text}" if key else text


def _expected_type(key: str) -> str:
    schema = trainer_config() if key.startswith("trainer.") else recipe_config()
    fields = {f.name: f.type for f in dataclasses.fields(schema)}
    type_name = str(fields.get(key.rsplit(".", 1)[-1], "another type"))
    for kind, plain in PLAIN_NAMES.items():
        if kind.__name__ in type_name:
            return plain + (" or null" if "Optional" in type_name else "")
    return type_name

