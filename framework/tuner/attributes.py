"""Where the Tuner finds the value it tunes (the learning rate, the batch size), as Lightning's
``lightning_hasattr`` / ``lightning_getattr`` / ``lightning_setattr`` do: an attribute of the
module, a key of ``module.hparams``, an attribute of the DataModule, a key of its ``hparams``.

Reading takes the last of these that has the name (the DataModule's over the module's, as in
Lightning); writing sets every one of them, so that ``configure_optimizers`` or a
``*_dataloader()`` reading any of them sees the tuned value.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any


class TunedValue:
    """The value called ``name`` on ``module`` and ``datamodule`` (either may be None)."""

    def __init__(self, name: str, module: Any, datamodule: Any = None) -> None:
        self.name = name
        self._owners = [owner for owner in (module, datamodule) if owner is not None]

    def holders(self) -> list[Any]:
        """The objects and dicts that hold the value, in Lightning's order."""
        found: list[Any] = []
        for owner in self._owners:
            if hasattr(owner, self.name):
                found.append(owner)
            hparams = getattr(owner, "hparams", None)
            if isinstance(hparams, MutableMapping) and self.name in hparams:
                found.append(hparams)
        return found

    def exists(self) -> bool:
        return bool(self.holders())

    def in_both_module_places(self) -> bool:
        """The module has it as an attribute and in its ``hparams`` (Lightning warns: the
        attribute is the one read)."""
        module = self._owners[0]
        hparams = getattr(module, "hparams", None)
        return hasattr(module, self.name) and isinstance(hparams, MutableMapping) and self.name in hparams

    def get(self) -> Any:
        holders = self.holders()
        assert holders, f"checked before: '{self.name}' exists"
        last = holders[-1]
        return last[self.name] if isinstance(last, MutableMapping) else getattr(last, self.name)

    def set(self, value: Any) -> None:
        for holder in self.holders():
            if isinstance(holder, MutableMapping):
                holder[self.name] = value
            else:
                setattr(holder, self.name, value)
