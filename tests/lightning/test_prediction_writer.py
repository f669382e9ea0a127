"""A prediction writer written for Lightning (``BasePredictionWriter``'s subclass, as Lightning's
docs write one) runs on fw as written and is called with what Lightning passes: the default
interval ``"batch"``, each batch's prediction and sample indices, at the epoch's end the
predictions (one list, or one per loader) and the indices per loader; ``interval.on_batch`` and
``interval.on_epoch`` as Lightning's."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import framework as fw
import framework.callbacks  # fw.callbacks, as pl.callbacks
from framework.errors import ConfigError

pl = pytest.importorskip("pytorch_lightning")


def _loader(n: int, seed: int) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    return DataLoader(TensorDataset(torch.randn(n, 4, generator=g)), batch_size=3)


def _written(lib, base: type, interval: str | None, loaders: int) -> list:
    calls: list = []

    class CustomWriter(lib.callbacks.BasePredictionWriter):  # as in Lightning's docs
        def __init__(self, output_dir, write_interval):
            super().__init__(write_interval) if write_interval else super().__init__()
            self.output_dir = output_dir

        def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx):
            calls.append(("batch", prediction.tolist(), batch_indices, batch_idx, dataloader_idx))

        def write_on_epoch_end(self, trainer, pl_module, predictions, batch_indices):
            flat = [p.tolist() for p in predictions] if loaders == 1 else [[p.tolist() for p in ps] for ps in predictions]
            calls.append(("epoch", flat, batch_indices))

    class Model(base):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.layer = torch.nn.Linear(4, 1)

        def predict_step(self, batch, batch_idx, dataloader_idx=0):
            return self.layer(batch[0]).squeeze(1)

    writer = CustomWriter("unused", interval)
    calls.append(("interval", writer.interval.value, writer.interval.on_batch, writer.interval.on_epoch))
    trainer = lib.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                          enable_model_summary=False, callbacks=[writer])
    data = _loader(7, 0) if loaders == 1 else [_loader(7, 0), _loader(5, 1)]
    trainer.predict(Model(), data, return_predictions=False)
    return calls


@pytest.mark.timeout(60)
@pytest.mark.parametrize("interval", [None, "epoch", "batch_and_epoch"])
@pytest.mark.parametrize("loaders", [1, 2])
def test_a_writer_written_for_lightning_is_called_as_lightning_calls_it(interval, loaders):
    ours = _written(fw, fw.TrainModule, interval, loaders)
    theirs = _written(pl, pl.LightningModule, interval, loaders)
    assert ours == theirs
    assert len(ours) >= 2 and ours[-1][0] == ("epoch" if interval else "batch")


def test_an_unknown_interval_is_refused():
    with pytest.raises(ConfigError, match=r"write_interval='step'.*batch, epoch, batch_and_epoch"):
        fw.callbacks.BasePredictionWriter("step")
