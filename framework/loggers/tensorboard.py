"""TensorBoard logger: scalars and hyperparameters as TensorBoard event files.

``torch.utils.tensorboard`` (and with it ``tensorboard``) is imported on the first write, not
when this module is imported, so that ``import framework`` stays light.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from framework.errors import ConfigError
from framework.loggers.base import Logger, flatten, save_hparams_yaml, to_float, to_plain

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter


class TensorBoardLogger(Logger):
    """Write metrics to ``<save_dir>/<name>/version_<N>/events.out.tfevents.*``.

    Hyperparameters go to TensorBoard's HPARAMS tab (nested keys flattened to ``"a/b"``) and to
    ``hparams.yaml`` in the same folder.

    Args:
        save_dir: Root folder; ``None`` lets the Trainer use its ``default_root_dir``.
        name: Experiment name (a sub-folder of ``save_dir``).
        version: ``None`` for the next free ``version_<N>``, an int, or a folder name.
        log_graph: Lightning's; ``True`` is refused (fw does not trace the model into TensorBoard).
        default_hp_metric: Also log a placeholder ``hp_metric = -1`` with the hyperparameters,
            which TensorBoard's HPARAMS tab needs to show a run.
        prefix: Put in front of every metric name, joined with ``"-"``, as Lightning's.
        sub_dir: A folder inside the version folder to write into (``~`` and variables expanded).
        kwargs: For ``SummaryWriter`` (``flush_secs`` is 10 unless given).

    The arguments are Lightning's, in its order.
    """

    def __init__(self, save_dir: str | os.PathLike | None = None, name: str | None = "fw_logs",
                 version: int | str | None = None, log_graph: bool = False, default_hp_metric: bool = True,
                 prefix: str = "", sub_dir: str | os.PathLike | None = None, **kwargs: Any) -> None:
        if log_graph:
            raise ConfigError("TensorBoardLogger(log_graph=True) is not supported by fw: it does not trace the model "
                              "into TensorBoard; leave log_graph out (self.logger.experiment.add_graph(...) does it)")
        super().__init__(save_dir, name, version)
        self.default_hp_metric, self._prefix = default_hp_metric, prefix
        self._sub_dir = os.path.expandvars(os.path.expanduser(os.fspath(sub_dir))) if sub_dir is not None else None
        self._writer_options = {"flush_secs": 10, **kwargs}
        self.hparams: dict[str, Any] = {}
        self._experiment: SummaryWriter | None = None

    @property
    def sub_dir(self) -> str | None:
        return self._sub_dir

    @property
    def log_dir(self) -> str:
        """The version folder, and ``sub_dir`` inside it when given (Lightning's)."""
        return os.path.join(self.version_dir, self._sub_dir) if self._sub_dir else self.version_dir

    @property
    def experiment(self) -> SummaryWriter:
        """The ``SummaryWriter``, created (with the log folder) on first use."""
        if self._experiment is None:
            from torch.utils.tensorboard import SummaryWriter

            os.makedirs(self.log_dir, exist_ok=True)
            self._experiment = SummaryWriter(log_dir=self.log_dir, **self._writer_options)
        return self._experiment

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        writer = self.experiment
        for key, value in metrics.items():
            writer.add_scalar(self._prefixed(key), to_float(value), global_step=step)

    def log_hyperparams(self, params: Mapping[str, Any] | argparse.Namespace,
                        metrics: Mapping[str, float] | None = None) -> None:
        """Record hyperparameters; repeated calls merge into one set.

        Args:
            params: Hyperparameters; nested mappings become ``"a/b"`` keys in TensorBoard.
            metrics: Optional metrics to show next to them in the HPARAMS tab.
        """
        self.hparams.update(to_plain(params))
        save_hparams_yaml(os.path.join(self.log_dir, "hparams.yaml"), self.hparams)

        metrics = dict(metrics or {})
        if self.default_hp_metric and not metrics:  # Lightning's placeholder, at each call's hyperparameters
            metrics = {"hp_metric": -1.0}
        if metrics:
            self.log_metrics(metrics, step=0)

        from torch.utils.tensorboard.summary import hparams

        # TensorBoard's hparams plugin takes only numbers, strings, bools (and tensors).
        flat = {k: (v if isinstance(v, (bool, int, float, str)) else str(v))
                for k, v in flatten(self.hparams).items()}
        # Written into this run's own event file; SummaryWriter.add_hparams would start a new
        # sub-run folder instead.
        writer = self.experiment._get_file_writer()
        for summary in hparams(flat, {k: to_float(v) for k, v in metrics.items()}):
            writer.add_summary(summary)

    def save(self) -> None:
        if self._experiment is not None:
            self._experiment.flush()
        hparams_file = os.path.join(self.log_dir, "hparams.yaml")
        if os.path.isdir(self.log_dir) and not os.path.isfile(hparams_file):  # Lightning's: also without any
            save_hparams_yaml(hparams_file, self.hparams)

    def finalize(self, status: str) -> None:
        if self._experiment is not None:
            self._experiment.flush()
            self._experiment.close()
            # A later write (e.g. trainer.test after fit) opens a new event file in the same folder.
            self._experiment = None
