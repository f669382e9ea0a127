"""Exporting a ``TrainModule``, as Lightning's ``to_onnx`` and ``to_torchscript`` do: traced with the
input given or ``example_input_array``, and the attributes fw keeps on a module hidden from TorchScript."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from framework.errors import require_package


class ModuleExport(nn.Module):
    """Mixed into ``TrainModule``."""

    example_input_array: Any  # TrainModule's property

    if TYPE_CHECKING:
        @property
        def device(self) -> torch.device: ...  # ModuleAttributes'

    def _export_input(self, given: Any, what: str) -> Any:
        from framework.accelerators.base import move_to_device

        sample = given if given is not None else self.example_input_array
        if sample is None:
            raise ValueError(f"{type(self).__name__}.{what}: no input to trace with; pass one, or set "
                             "self.example_input_array in __init__")
        return move_to_device(sample, self.device)

    def to_onnx(self, file_path: str | Path | Any = None, input_sample: Any = None, **kwargs: Any) -> Any:
        """The module exported with ``torch.onnx.export`` (``kwargs`` are its), traced with
        ``input_sample`` or ``example_input_array``; written to ``file_path`` when given."""
        require_package("onnx", f"{type(self).__name__}.to_onnx()", "pip install onnx onnxscript")
        mode = self.training
        sample = self._export_input(input_sample, "to_onnx()")
        path = str(file_path) if isinstance(file_path, Path) else file_path
        result = torch.onnx.export(self, sample, path, **kwargs)
        self.train(mode)
        return result

    @torch.no_grad()
    def to_torchscript(self, file_path: str | Path | None = None, method: str | None = "script",
                       example_inputs: Any = None, **kwargs: Any) -> Any:
        """The module as a ``torch.jit.ScriptModule`` (in eval mode): ``method="script"`` compiles
        ``forward``, ``"trace"`` traces it with ``example_inputs`` (or ``example_input_array``);
        saved to ``file_path`` when given. TorchScript is deprecated in PyTorch (use
        ``torch.export``), as Lightning 2.7 also says."""
        if method not in ("script", "trace"):
            raise ValueError(f"to_torchscript(method={method!r}): use 'script' or 'trace'")
        mode = self.training
        modules = [m for m in self.modules() if isinstance(m, ModuleExport)]
        for m in modules:  # the scripting reads every attribute: ``trainer`` must not raise then
            object.__setattr__(m, "_jit_is_scripting", True)
        try:
            if method == "script":
                scripted = torch.jit.script(self.eval(), **kwargs)
            else:
                sample = self._export_input(example_inputs, "to_torchscript(method='trace')")
                scripted = torch.jit.trace(func=self.eval(), example_inputs=sample, **kwargs)
        finally:
            for m in modules:
                object.__setattr__(m, "_jit_is_scripting", False)
            self.train(mode)
        if file_path is not None:
            torch.jit.save(scripted, str(file_path))
        return scripted


#: the attributes fw keeps on a module (the Trainer, the flags): not for TorchScript to type
JIT_IGNORED_ATTRIBUTES = ["_trainer", "_automatic_optimization", "_toggled", "_hparams", "_hparams_initial",
                          "_log_hyperparams", "_strict_loading", "_example_input_array", "_jit_is_scripting",
                          "_wrapped_optimizers"]


def jit_unused_properties(cls: type) -> list[str]:
    """The properties of ``cls`` that ``torch.jit.script`` must not compile (they read the
    Trainer): all of them, as Lightning lists its own."""
    return sorted({name for klass in cls.__mro__ if klass.__module__.startswith("framework.")
                   for name, value in vars(klass).items() if isinstance(value, property)})
