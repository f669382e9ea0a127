"""``Trainer(compile=True)`` (recipe: ``trainer.compile: true``, or a mapping of ``torch.compile``'s
options, e.g. ``{mode: max-autotune, fullgraph: true}``, plus fw's ``fallback``).

After the strategy wrapped or sharded the model, fw compiles the ``forward`` of each block (the
units the strategy shards: ``fsdp``'s ``auto_wrap_policy``, the blocks ``fw.parallel.parallelize``
split) or, with no blocks, of the module itself (when it defines ``forward``) or of each of its
submodules with parameters. Only ``forward`` is replaced, on the instance: the module's hooks (the
strategy's, activation checkpointing's) run around the compiled code as they ran around the eager
one, and the parameters keep their names, so ``state_dict()`` and checkpoints never carry
``_orig_mod.``. Blocks of one class share one compiled graph.

The first call compiles (tens of seconds on a CPU): fw says so before it and, after the first
optimizer step (or the first evaluation step), how long that took. A module ``torch.compile``
cannot compile (say ``fullgraph=True`` on a forward with a graph break) runs eagerly with one
warning naming why, or stops with that line under ``fallback: false``; so does a CPU run with no
C++ compiler for inductor to build with.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Mapping
from typing import Any

from torch import nn

from framework.errors import ConfigError, first_line
from framework.rank_zero import rank_zero_info, rank_zero_warn

KEY = "trainer.compile"
#: torch.compile's keyword arguments a recipe may give
TORCH_OPTIONS = ("fullgraph", "dynamic", "backend", "mode", "options")
#: set on a module whose forward fw compiled
_COMPILED = "_fw_compiled"


def compile_options(value: Any) -> dict[str, Any] | None:
    """``trainer.compile`` as given: None (off), or ``torch.compile``'s options and ``fallback``."""
    if value is None or value is False:
        return None
    if value is True:
        return {"fallback": True}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{KEY}={value!r}: give true, false, or a mapping of torch.compile's options "
                          f"({', '.join(TORCH_OPTIONS)}) and fallback")
    unknown = sorted(set(value) - {*TORCH_OPTIONS, "fallback"})
    if unknown:
        raise ConfigError(f"{KEY}.{unknown[0]}: not an option; give {', '.join(TORCH_OPTIONS)} or fallback "
                          "(true: run eagerly with a warning when compiling fails)")
    return {"fallback": True, **value}


def compile_model(module: nn.Module, options: dict[str, Any] | None, blocks: list[nn.Module],
                  device_type: str) -> CompileRun | None:
    """Compile the forward of each of ``blocks`` (or of the module, see the module docstring);
    the run's ``CompileRun``, or None when nothing is compiled."""
    if options is None:
        return None
    torch_options = {k: v for k, v in options.items() if k in TORCH_OPTIONS}
    missing = _missing_compiler(torch_options.get("backend", "inductor"), device_type)
    shared = CompileRun(bool(options["fallback"]))
    if missing is not None:
        shared.give_up(missing)
        return None
    targets = blocks or _whole(module)
    for target in targets:
        if not target.__dict__.get(_COMPILED):
            target.forward = _CompiledForward(target.forward, _torch_compile(target.forward, torch_options), shared)
            target.__dict__[_COMPILED] = True
    names = sorted({type(t).__name__ for t in targets})
    shared.what = f"{len(targets)} module(s) of class {', '.join(names)}" if targets else "nothing"
    return shared


def _torch_compile(forward: Any, options: dict[str, Any]) -> Any:
    """``torch.compile(forward, **options)``; a mode, backend or option torch does not have (it
    checks them here, before compiling anything) is the recipe's mistake: one line that names it."""
    import torch
    from torch._dynamo.exc import InvalidBackend

    try:
        return torch.compile(forward, **options)
    except InvalidBackend:
        raise ConfigError(f"{KEY}.backend={options.get('backend')!r}: not a torch.compile backend; give inductor (the "
                          "default), aot_eager, eager, or another that torch._dynamo.list_backends() names") from None
    except RuntimeError as err:  # torch's: "Unrecognized mode=...", "Unexpected optimization option ..."
        given = ", ".join(f"{k}={options[k]!r}" for k in ("mode", "options") if k in options)
        why = first_line(err)
        raise ConfigError(f"{KEY} {given}: {why[:400] + ' ...' if len(why) > 400 else why}") from None


def _whole(module: nn.Module) -> list[nn.Module]:
    """No blocks: the module itself if it has a forward of its own, else its submodules with
    parameters (not metrics)."""
    if type(module).forward is not nn.Module.forward:
        return [module]
    return [child for child in module.children()
            if any(True for _ in child.parameters()) and not type(child).__module__.startswith("torchmetrics")]


def _missing_compiler(backend: str, device_type: str) -> str | None:
    """Why inductor could not build here (no C++ compiler on a CPU run), or None."""
    if backend != "inductor" or device_type != "cpu":
        return None
    from torch._inductor import config

    wanted = config.cpp.cxx[1] if isinstance(config.cpp.cxx, tuple) else config.cpp.cxx
    found = [c for c in (wanted, "g++", "c++", "clang++") if c and shutil.which(c)]
    return None if found else (f"no C++ compiler found ({wanted or 'g++'} is not on PATH), which torch.compile's "
                               "inductor needs on a CPU: install one (apt-get install g++), or set "
                               f"{KEY}.backend=aot_eager")


class CompileRun:
    """What one call's compiled modules share: the messages said once, and the switch to eager."""

    def __init__(self, fallback: bool) -> None:
        self.fallback, self.eager, self.what = fallback, False, ""
        self.started: float | None = None
        self.reported = False

    def start(self) -> None:
        self.started = time.perf_counter()
        rank_zero_info(f"fw: compiling {self.what} with torch.compile: the first step compiles them and takes "
                       "longer (tens of seconds on a CPU)")

    def report(self, what: str = "the first step") -> None:
        if self.started is not None and not self.reported and not self.eager:
            self.reported = True
            rank_zero_info(f"fw: compiled: {what} took {time.perf_counter() - self.started:.1f} s")

    def give_up(self, why: str) -> None:
        if not self.fallback:
            raise ConfigError(f"{KEY}: {why} ({KEY}.fallback=false: stopped)")
        self.eager = True
        rank_zero_warn(f"{KEY}: {why}; the model runs eagerly")

    def after_first_step(self, optimizers: list) -> None:
        """Say how long compiling took, once the first optimizer step is done."""
        from framework.optim import after_first_step

        for optimizer in optimizers:
            after_first_step(optimizer, self.report)


class _CompiledForward:
    """A module's forward, compiled: the eager one until ``torch.compile`` first succeeded if it
    fails (a real error in the module raises from the eager call as it would without compile)."""

    def __init__(self, eager: Any, compiled: Any, shared: CompileRun) -> None:
        self.eager, self.compiled, self.shared = eager, compiled, shared
        self.succeeded = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        shared = self.shared
        if shared.eager:
            return self.eager(*args, **kwargs)
        if shared.started is None:
            shared.start()
        if self.succeeded:
            return self.compiled(*args, **kwargs)
        from torch._dynamo.exc import TorchDynamoException

        try:
            out = self.compiled(*args, **kwargs)
        except TorchDynamoException as err:
            out = self.eager(*args, **kwargs)  # the module's own error, if it has one, is raised here
            shared.give_up(f"{type(err).__name__}: {str(err).strip().splitlines()[0][:300]}")
            return out
        self.succeeded = True
        import torch

        if not torch.is_grad_enabled():  # evaluation or predict: no optimizer step will say it
            shared.report("the first evaluation step")
        return out
