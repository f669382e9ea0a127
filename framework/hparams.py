"""Hyperparameters: ``save_hyperparameters`` records the ``__init__`` arguments in
``self.hparams`` (an ``AttributeDict``), checkpoints keep them, and ``load_from_checkpoint``
rebuilds the module from them, as in Lightning."""

from __future__ import annotations

import copy
import inspect
import os
from argparse import Namespace
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeVar

from framework.errors import ConfigError

M = TypeVar("M", bound="HyperparametersMixin")


class _ClassOnly(classmethod):
    """``@classmethod`` that refuses a call on an instance, as Lightning's ``load_from_checkpoint``
    does: ``model.load_from_checkpoint(path)`` would return a new model and leave ``model`` as it was."""

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return super().__get__(instance, owner)
        name = f"{type(instance).__name__}.{self.__func__.__name__}"

        def refused(*args: Any, **kwargs: Any) -> Any:
            raise TypeError(f"The classmethod `{name}` cannot be called on an instance. Please call it on the "
                            "class type and make sure the return value is used.")

        return refused


if TYPE_CHECKING:  # the type checker knows classmethod's types
    class_only = classmethod
else:
    class_only = _ClassOnly


class AttributeDict(dict):
    """A dict whose keys are also attributes (``self.hparams.lr``), as Lightning's hparams."""

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError as err:
            raise AttributeError(f"hparams has no '{key}'; it has: {', '.join(map(str, self)) or 'nothing'}") from err

    def __setattr__(self, key: str, value: Any) -> None:
        self[key] = value

    def __delattr__(self, key: str) -> None:
        del self[key]


class HyperparametersMixin:
    """``save_hyperparameters``, ``hparams``, ``hparams_initial``, ``load_from_checkpoint`` of a
    ``TrainModule`` and a ``DataModule``."""

    @property
    def hparams(self) -> AttributeDict:
        """The hyperparameters ``save_hyperparameters`` recorded (empty before); made on first
        use, so that a subclass's ``__init__`` need not call ``super().__init__()`` first."""
        found = self.__dict__.get("_hparams")
        if found is None:
            found = AttributeDict()
            object.__setattr__(self, "_hparams", found)  # past nn.Module's __setattr__
        return found

    def save_hyperparameters(self, *args: Any, ignore: list[str] | str | None = None, frame: FrameType | None = None,
                             logger: bool = True) -> None:
        """Record the caller's ``__init__`` arguments in ``self.hparams`` (attribute access:
        ``self.hparams.lr``), as Lightning does.

        They are stored in checkpoints (``load_from_checkpoint`` rebuilds the module from them)
        and sent to loggers. ``args`` picks some by name, or is one dict / ``Namespace`` to save
        instead; ``ignore`` leaves some out (e.g. a large tensor or a sub-module).
        """
        if frame is None:
            here = inspect.currentframe()
            assert here is not None and here.f_back is not None, "CPython gives every call a frame"
            frame = here.f_back
        if len(args) == 1 and isinstance(args[0], (dict, Namespace)):
            given = args[0]
            found = dict(vars(given) if isinstance(given, Namespace) else given)
        else:
            code = frame.f_code  # the __init__ that called us (a subclass may have another signature)
            arg_names = code.co_varnames[1 : code.co_argcount + code.co_kwonlyargcount]
            found = {k: frame.f_locals[k] for k in arg_names if k in frame.f_locals}
            if code.co_flags & inspect.CO_VARKEYWORDS:  # **kwargs are flattened into hparams
                varkw = code.co_varnames[code.co_argcount + code.co_kwonlyargcount
                                         + bool(code.co_flags & inspect.CO_VARARGS)]
                found.update(frame.f_locals.get(varkw, {}))
            if args:
                found = {k: v for k, v in found.items() if k in args}
        ignored = {ignore} if isinstance(ignore, str) else set(ignore or ())
        self.hparams.update({k: v for k, v in found.items() if k not in ignored})
        object.__setattr__(self, "_hparams_initial", copy.deepcopy(self.hparams))
        object.__setattr__(self, "_log_hyperparams", logger)  # logger=False: the loggers do not get them

    @property
    def hparams_initial(self) -> AttributeDict:
        """The hyperparameters as ``save_hyperparameters`` recorded them (later edits of
        ``self.hparams`` do not show here)."""
        return copy.deepcopy(self.__dict__.get("_hparams_initial", AttributeDict()))

    @class_only
    def load_from_checkpoint(cls: type[M], checkpoint_path: Any, map_location: Any = None, hparams_file: Any = None,
                             strict: bool | None = None, **kwargs: Any) -> M:
        """A module of this class rebuilt from a checkpoint: ``__init__`` gets the saved
        hyperparameters (``save_hyperparameters``), overridden by ``kwargs``; then the weights
        are loaded. ``map_location`` as in ``torch.load``."""
        from framework.checkpoint import load_from_checkpoint

        return load_from_checkpoint(cls, checkpoint_path, map_location=map_location, strict=strict,
                                    hparams_file=hparams_file, **kwargs)


def hparams_from_file(path: Any) -> dict[str, Any]:
    """Hyperparameters from a YAML file (``hparams.yaml``, as the loggers write it) or a CSV of
    ``key,value`` rows, for ``load_from_checkpoint(hparams_file=...)`` (Lightning's formats)."""
    import ast
    import csv

    import yaml

    suffix = os.path.splitext(os.fspath(path))[1].lower()
    with open(path, newline="") as f:
        if suffix in (".yaml", ".yml"):
            return dict(yaml.safe_load(f) or {})
        if suffix == ".csv":
            def value(text: str) -> Any:
                try:
                    return ast.literal_eval(text)
                except (ValueError, SyntaxError):
                    return text

            return {row[0]: value(row[1]) for row in list(csv.reader(f))[1:]}
    raise ConfigError(f"hparams_file '{path}': give a .yaml, .yml or .csv file, as Lightning reads")
