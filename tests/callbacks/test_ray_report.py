"""``RayTrainReport``'s arguments, a missing ray, and how ``framework.ray`` picks the worker error to raise
(the reports and resumes themselves run on a Ray cluster: tests/ray_train)."""

from __future__ import annotations

import sys

import pytest
import torch

import framework as fw
import framework.ray
from framework.callbacks import RayTrainReport
from framework.callbacks.ray_report import _scalars, import_ray_train
from framework.errors import ConfigError


def test_report_points():
    assert (RayTrainReport().every_n_epochs, RayTrainReport().every_n_train_steps) == (1, 0)
    both = RayTrainReport(every_n_train_steps=50)
    assert (both.every_n_epochs, both.every_n_train_steps) == (0, 50)
    assert RayTrainReport(every_n_epochs=2, every_n_train_steps=50).every_n_epochs == 2
    for bad in ({"every_n_epochs": -1}, {"every_n_train_steps": 1.5}, {"every_n_epochs": True}):
        with pytest.raises(ConfigError, match=r"RayTrainReport\(every_n_\w+=.*\) must be an int >= 0"):
            RayTrainReport(**bad)


def test_only_numbers_are_reported():
    metrics = {"loss": torch.tensor(0.5), "acc": 1, "vector": torch.ones(3), "name": "x"}
    assert _scalars(metrics) == {"loss": 0.5, "acc": 1.0}


def test_without_ray_one_line_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    monkeypatch.setitem(sys.modules, "ray.train", None)
    with pytest.raises(ConfigError, match=r"needs ray\[train\] .*pip install .*\[ray\]") as caught:
        import_ray_train()
    assert "\n" not in str(caught.value)
    with pytest.raises(ConfigError, match=r"\[ray\]"):
        framework.ray.fit(object())


class _WorkerGroupError(Exception):  # the shape of Ray's: worker_failures maps rank -> the error raised there
    def __init__(self, failures):
        super().__init__("Training failed due to worker errors: ...")
        self.worker_failures = failures


def test_the_users_error_of_the_lowest_rank_is_raised():
    bad = ConfigError("trainer.devices=3: ...")
    found = framework.ray.worker_error(_WorkerGroupError({1: RuntimeError("peer gone"), 2: bad}))
    assert found is bad  # fw's own error first: the others follow from it
    same = framework.ray.worker_error(_WorkerGroupError({1: ValueError("nan"), 0: ValueError("nan")}))
    assert str(same) == "nan"
    if sys.version_info >= (3, 11):
        assert same.__notes__ == ["(raised in Ray Train worker ranks 0,1; the traceback is in Ray's log above)"]
    assert framework.ray.worker_error(_WorkerGroupError({})) is None


def test_outside_ray_the_callback_is_refused(tmp_path):
    class Net(fw.TrainModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    model = Net()
    trainer = fw.Trainer(accelerator="cpu", devices=1, max_steps=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(tmp_path),
                         callbacks=[RayTrainReport()])
    with pytest.raises(ConfigError, match=r"RayTrainReport reports to Ray Train, and this process is no Ray Train "
                                          r"worker \(it runs under local\)"):
        trainer.fit(model, [torch.zeros(1)])
