"""``PredictionWriter``: predictions written to files, every rank's gathered in the data's order.

``fw predict`` adds one writing ``predictions.pt`` into the run directory; in Python, pass one to
the Trainer. A ``BasePredictionWriter`` (Lightning's, ``base_prediction_writer.py``) that gathers
every rank's predictions before it writes; to write your own format per rank, subclass
``BasePredictionWriter`` itself, as for Lightning.

- ``write_interval="epoch"`` (default): at the end of predict, rank 0 writes all predictions in
  one file. Under DDP each rank predicted its own shard; rank 0 puts the samples back in the
  data set's order (the shard's sample indices are known for unshuffled loaders) when every
  prediction is a tensor whose first dimension is the batch; otherwise it keeps rank order.
- ``write_interval="batch"``: each rank writes each batch's predictions as it goes
  (``<output_dir>/batches/rank<R>_loader<L>_batch<B>.pt``); ``"batch_and_epoch"``: both.
- ``output_dir`` (or the run directory) may be a URL (``s3://bucket/run``): each file is written
  locally, then uploaded whole (``framework/paths.py``).
- ``format``: ``"pt"`` (``torch.save``: one tensor when the predictions concatenate, else the
  list of batch outputs; a list per loader with several loaders) or ``"csv"`` (one row per
  sample of 1-D or 2-D tensor predictions).
"""

from __future__ import annotations

import csv
import os
import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from framework import paths
from framework.callbacks.base_prediction_writer import BasePredictionWriter, to_cpu
from framework.rank_zero import rank_zero_info

if TYPE_CHECKING:
    from framework.module import TrainModule
    from framework.trainer import Trainer

class PredictionWriter(BasePredictionWriter):
    """Write predictions (see the module doc).

    Args:
        output_dir: where to write, a folder or a URL; None: the run directory (the logger's, else
            ``default_root_dir``).
        write_interval: ``"epoch"``, ``"batch"`` or ``"batch_and_epoch"``.
        format: ``"pt"`` or ``"csv"``.
        filename: the epoch file's name without extension.
    """

    def __init__(self, output_dir: str | None = None, write_interval: str = "epoch", format: str = "pt",
                 filename: str = "predictions") -> None:
        from framework.errors import ConfigError

        super().__init__(write_interval)  # checks it, and keeps each loader's batch indices
        if format not in ("pt", "csv"):
            raise ConfigError(f"PredictionWriter format '{format}': use pt or csv")
        self.write_interval, self.format, self.filename = write_interval, format, filename
        self.output_dir = paths.storage_path(output_dir, "PredictionWriter output_dir") if output_dir is not None else None
        self.written: str | None = None  # the epoch file, once written
        self._outputs: list[list[Any]] = []  # per loader: (batch indices, outputs), to gather

    # -- Lightning's overridable writers ---------------------------------------------------------
    def write_on_batch_end(self, trainer: Trainer, module: TrainModule, prediction: Any,
                           batch_indices: list[int] | None, batch: Any,
                           batch_idx: int, dataloader_idx: int) -> None:
        path = paths.join(self._dir(trainer), "batches",
                          f"rank{trainer.global_rank}_loader{dataloader_idx}_batch{batch_idx}.pt")
        kept = {"prediction": to_cpu(prediction), "batch_indices": batch_indices}
        _write(path, lambda local: torch.save(kept, local))

    def write_on_epoch_end(self, trainer: Trainer, module: TrainModule, predictions: list[Any],
                           batch_indices: list[Any]) -> None:
        """Rank 0 only: ``predictions`` per loader, all ranks' in the data's order."""
        path = paths.join(self._dir(trainer), f"{self.filename}.{self.format}")
        merged = [_concat(p) for p in predictions]
        if self.format == "pt":
            _write(path, lambda local: torch.save(merged[0] if len(merged) == 1 else merged, local))
        else:
            _write(path, lambda local: _write_csv(local, merged))
        self.written = path
        count = sum(len(m) if isinstance(m, (torch.Tensor, list)) else 1 for m in merged)
        rank_zero_info(f"fw predict: wrote {count} predictions to {path}")

    # -- hooks ------------------------------------------------------------------------------------
    def on_predict_epoch_start(self, trainer: Trainer, module: TrainModule) -> None:
        super().on_predict_epoch_start(trainer, module)
        self._outputs = [[] for _ in self._batch_indices]

    def _keep_for_epoch(self, dataloader_idx: int, indices: list[int] | None, outputs: Any) -> None:
        self._outputs[dataloader_idx].append((indices, outputs))  # each rank's, gathered at the epoch's end

    def on_predict_epoch_end(self, trainer: Trainer, module: TrainModule) -> None:
        if not self.interval.on_epoch:
            return
        mine = self._outputs
        everyone = trainer.strategy.all_gather_object(mine) if trainer.strategy.is_distributed else [mine]
        self._outputs = []
        if not trainer.is_global_zero:
            return
        predictions, indices = [], []
        for loader in range(len(mine)):
            batches = [item for rank in everyone for item in rank[loader]]
            ordered, order = _in_data_order(batches)
            predictions.append(ordered)
            indices.append(order)
        self.write_on_epoch_end(trainer, module, predictions, indices)

    def _dir(self, trainer: Trainer) -> str:
        return self.output_dir or trainer.log_dir or trainer.default_root_dir


def _write(path: str, write: Callable[[str], None]) -> None:
    """``write(local_path)`` at ``path``: there, or for a URL into a local file then uploaded whole."""
    if not paths.is_url(path):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        write(path)
        return
    with tempfile.TemporaryDirectory(prefix="fw-predictions-") as folder:
        local = os.path.join(folder, paths.basename(path))
        write(local)
        with open(local, "rb") as f:
            paths.write_bytes(path, f.read())


def _in_data_order(batches: list[tuple[list[int] | None, Any]]) -> tuple[list[Any], list[int] | None]:
    """Per-sample predictions sorted by data set index when possible, else the batches as given."""
    samples: list[tuple[int, Any]] = []
    for indices, output in batches:
        if indices is None or not isinstance(output, torch.Tensor) or output.dim() == 0 or len(output) != len(indices):
            return [output for _, output in batches], None
        samples.extend(zip(indices, output, strict=True))
    samples.sort(key=lambda pair: pair[0])
    return [row for _, row in samples], [i for i, _ in samples]


def _concat(outputs: list[Any]) -> Any:
    """One tensor when the predictions stack or concatenate, else the list itself."""
    if outputs and all(isinstance(o, torch.Tensor) for o in outputs):
        shapes = {tuple(o.shape) for o in outputs}
        if len(shapes) == 1:
            return torch.stack(outputs)
        try:
            return torch.cat(outputs)
        except RuntimeError:
            pass
    return outputs


def _write_csv(path: str, merged: list[Any]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        for loader, predictions in enumerate(merged):
            rows = predictions if isinstance(predictions, torch.Tensor) else _concat(list(predictions))
            if not isinstance(rows, torch.Tensor) or rows.dim() > 2:
                from framework.errors import ConfigError

                raise ConfigError("PredictionWriter format csv needs 1-D or 2-D tensor predictions; use format=pt")
            for i, row in enumerate(rows.reshape(len(rows), -1).tolist()):
                writer.writerow([loader, i, *row])
