"""What a call releases at its end (``setup.teardown``, ``Run.release``) and what the Trainer keeps
until the next call, side by side with Lightning: a loader's worker processes
(``persistent_workers=True`` keeps them between passes) end with the call, the last batch (on
the device) is dropped, and a test's loaders go with the next call; the batch counts, the
fit's optimizers and what ``save_checkpoint`` writes stay. Before, fw kept the last Run of each
kind whole: a test's workers ran on through the predict and fit after it, and its last batch
stayed in memory."""

from __future__ import annotations

import gc
import multiprocessing
import weakref
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import framework as fw

pl = pytest.importorskip("pytorch_lightning")


def _module(base: type, seen: dict[str, Any], test_batch: int = 4, workers: int = 0) -> Any:
    class Model(base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def forward(self, x):
            return self.layer(x)

        def training_step(self, batch, batch_idx):
            return (self.layer(batch[0]) ** 2).mean()

        def test_step(self, batch, batch_idx):
            seen["batch"] = weakref.ref(batch[0])
            self.log("t", self.layer(batch[0]).sum())

        def predict_step(self, batch, batch_idx):
            return self.layer(batch[0])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self):
            return DataLoader(TensorDataset(torch.randn(16, 4)), batch_size=4)

        def test_dataloader(self):
            loader = DataLoader(TensorDataset(torch.randn(16, 4)), batch_size=test_batch, num_workers=workers,
                                persistent_workers=workers > 0)
            seen["test_loader"] = weakref.ref(loader)
            return loader

        def predict_dataloader(self):
            return DataLoader(TensorDataset(torch.randn(16, 4)), batch_size=4)

    return Model()


def _trainer(which: str) -> Any:
    Trainer = pl.Trainer if which == "lightning" else fw.Trainer
    return Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_progress_bar=False,
                   enable_model_summary=False, enable_checkpointing=False)


def _base(which: str) -> type:
    return pl.LightningModule if which == "lightning" else fw.TrainModule


@pytest.mark.procs
@pytest.mark.timeout(120)
def test_a_loaders_persistent_workers_end_with_the_call_as_in_lightning():
    """fit, test on 2 persistent workers, predict, fit: no worker runs after the test, as in
    Lightning (fw's kept Run of the test kept its 2 workers alive to the end)."""
    found = {}
    for which in ("lightning", "fw"):
        seen: dict[str, Any] = {}
        model, trainer = _module(_base(which), seen, workers=2), _trainer(which)
        before = len(multiprocessing.active_children())
        try:
            trainer.fit(model)
            trainer.test(model, verbose=False)
            after_test = len(multiprocessing.active_children()) - before
            trainer.predict(model)
            gc.collect()
            found[which] = (after_test, len(multiprocessing.active_children()) - before,
                            seen["test_loader"]() is not None, trainer.num_test_batches)
        finally:
            loader = seen.get("test_loader", lambda: None)()
            if loader is not None and getattr(loader, "_iterator", None) is not None:
                loader._iterator._shutdown_workers()  # a failing run's workers end here too
    assert found["fw"] == found["lightning"] == (0, 0, False, [4])


def test_the_last_batch_of_a_call_is_not_kept_after_it():
    """The test's last batch (on the device, however large) is gone after the predict and
    fit that follow, and already after the test itself, as in Lightning (``_results.batch =
    None``); fw's kept test Run held it in ``metrics.current_batch``."""
    for which in ("lightning", "fw"):
        seen: dict[str, Any] = {}
        model, trainer = _module(_base(which), seen, test_batch=16), _trainer(which)
        trainer.test(model, verbose=False)
        gc.collect()
        assert seen["batch"]() is None, f"{which}: the test's last batch outlived the test"
        trainer.predict(model)
        trainer.fit(model)
        gc.collect()
        assert seen["batch"]() is None, f"{which}: the test's last batch outlived the calls after it"
        assert trainer.num_test_batches == [1]


def test_what_the_trainer_keeps_between_calls_is_the_last_fit_and_the_batch_counts():
    """After fit, test, predict: the fit's optimizers and Run (what save_checkpoint writes), the
    test's and predict's batch counts, as Lightning's loops keep theirs; the test's Run and
    loaders are not kept (Lightning drops every loop's loaders at the next call)."""
    seen: dict[str, Any] = {}
    model, trainer = _module(fw.TrainModule, seen), _trainer("fw")
    trainer.fit(model)
    fit = trainer.run
    trainer.test(model, verbose=False)
    trainer.predict(model)
    gc.collect()
    assert trainer.last_fit is fit and trainer.optimizers == fit.optimizers != []
    assert trainer.batch_counts == {"test": [4], "predict": [4]} and trainer.num_predict_batches == [4]
    assert seen["test_loader"]() is None  # nor the test's Run, which holds it
    assert all(run.metrics.current_batch is None for run in (fit, trainer.run))
