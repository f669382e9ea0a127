"""The logger of a ``fast_dev_run``, as Lightning's ``DummyLogger``: it takes every call and
writes nothing, so that a module's ``self.logger.experiment.add_image(...)`` runs in a dev run
as in a real one."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import Any

from framework.loggers.base import Logger


class DummyExperiment:
    """Any attribute is a function that does nothing; indexing gives the experiment again."""

    def nop(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, _: Any) -> Any:
        return self.nop

    def __getitem__(self, idx: int) -> DummyExperiment:
        return self

    def __setitem__(self, *args: Any) -> None:
        pass


class DummyLogger(Logger):
    """Lightning's: no folder, no name, no version; logs go nowhere."""

    def __init__(self) -> None:
        super().__init__(save_dir=None, name="")
        self._experiment = DummyExperiment()

    @property
    def experiment(self) -> DummyExperiment:
        return self._experiment

    @property
    def version(self) -> str:
        return ""

    @property
    def save_dir(self) -> None:  # type: ignore[override]  # Lightning's: None
        return None

    @property
    def log_dir(self) -> None:  # type: ignore[override]  # no run folder: trainer.log_dir is None, as in Lightning
        return None

    def set_default_root(self, root_dir: str | os.PathLike, resume_from: str | None = None) -> None:
        pass

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        pass

    def log_hyperparams(self, params: Mapping[str, Any] | argparse.Namespace, *args: Any, **kwargs: Any) -> None:
        pass

    def __getitem__(self, idx: int) -> DummyLogger:
        return self

    def __getattr__(self, name: str) -> Any:
        """Any other logging method a logger may have (``log_text``, ``log_image``) does nothing;
        other names are not there (fw asks loggers for optional attributes with ``getattr``)."""
        if not name.startswith("log_"):
            raise AttributeError(name)

        def nop(*args: Any, **kwargs: Any) -> None:
            pass

        return nop
