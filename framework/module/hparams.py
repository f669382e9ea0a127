"""Hyperparameters: ``save_hyperparameters`` records the ``__init__`` arguments in
``self.hparams`` (an ``AttributeDict``), checkpoints keep them, and ``load_from_checkpoint``
rebuilds the module from them, as in Lightning."""

from __future__ import annotations

import copy
import inspect
from argparse import Namespace
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeVar

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


def _init_args(frame: FrameType, obj: Any) -> dict[str, Any]:
    """The arguments of ``obj``'s ``__init__`` chain, as Lightning collects them: from the nearest
    frame of a method of ``obj`` whose class calls ``super()`` (a helper or lambda in between is
    passed over) outwards through the enclosing ``__init__`` frames of its subclasses, whose
    values win. Unlike Lightning, the frames of another object stop the chain (a module built in
    another module's ``__init__`` gets its own arguments, not the outer module's). Where there is
    none (an ``__init__`` that calls its base by name), the calling frame's own arguments."""
    chain: list[dict[str, Any]] = []
    here: FrameType | None = frame
    while here is not None and here.f_back is not None:
        cls, code = here.f_locals.get("__class__"), here.f_code
        mine = code.co_argcount > 0 and here.f_locals.get(code.co_varnames[0]) is obj
        if isinstance(cls, type) and issubclass(cls, HyperparametersMixin) and mine:
            chain.append(_arguments(here))
        elif chain:
            break
        here = here.f_back
    found: dict[str, Any] = {}
    for arguments in chain or [_arguments(frame)]:
        found.update(arguments)
    return found


def _warn_about_modules(hparams: dict[str, Any]) -> None:
    """Lightning's warning: a sub-module among the hyperparameters is saved with the weights
    already (a checkpoint keeps only its text among the hyperparameters)."""
    from torch import nn

    from framework.rank_zero import rank_zero_warn

    for name, value in hparams.items():
        if isinstance(value, nn.Module):
            rank_zero_warn(f"Attribute {name!r} is an instance of `nn.Module` and is already saved during "
                           f"checkpointing. It is recommended to ignore them using "
                           f"`self.save_hyperparameters(ignore=[{name!r}])`.")


def _arguments(frame: FrameType) -> dict[str, Any]:
    """The arguments a frame's function was called with (less ``self``), ``**kwargs`` flattened."""
    code, local = frame.f_code, frame.f_locals
    named = code.co_argcount + code.co_kwonlyargcount
    found = {k: local[k] for k in code.co_varnames[1:named] if k in local}
    if code.co_flags & inspect.CO_VARKEYWORDS:
        found.update(local.get(code.co_varnames[named + bool(code.co_flags & inspect.CO_VARARGS)], {}))
    return found


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
            found = _init_args(frame, self)
            if args:
                found = {k: v for k, v in found.items() if k in args}
        ignored = {ignore} if isinstance(ignore, str) else set(ignore or ())
        kept = {k: v for k, v in found.items() if k not in ignored}
        _warn_about_modules(kept)
        self.hparams.update(kept)
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
        from framework.checkpointing.rebuild import load_from_checkpoint

        return load_from_checkpoint(cls, checkpoint_path, map_location=map_location, strict=strict,
                                    hparams_file=hparams_file, **kwargs)
