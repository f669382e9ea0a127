"""``RayTrainReport``'s arguments, a missing ray, how ``framework.ray`` picks the worker error to raise, and
its reports and resumes in one process with Ray's API faked at the boundary (when a report is made, which
fit resumes from Ray's checkpoint, the downloaded copy removed); on a Ray cluster: tests/ray_train."""

from __future__ import annotations

import json
import os
import shutil
import sys
import types

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


# -- reports and resumes, with Ray's API faked at the boundary ----------------------------------------
class _FakeCheckpoint:
    """``ray.train.Checkpoint``'s part fw uses: a folder, its metadata (Ray's ``.metadata.json``), a download."""

    def __init__(self, path, remote=False):
        self.path = str(path)
        self.filesystem = types.SimpleNamespace(type_name="s3" if remote else "local")
        self.downloads: list[str] = []

    @classmethod
    def from_directory(cls, path):
        return cls(path)

    def set_metadata(self, metadata):
        with open(os.path.join(self.path, ".metadata.json"), "w") as f:
            json.dump(metadata, f)

    def get_metadata(self):
        found = os.path.join(self.path, ".metadata.json")
        return json.load(open(found)) if os.path.exists(found) else {}

    def to_directory(self, path):
        self.downloads.append(path)
        shutil.copytree(self.path, path, dirs_exist_ok=True)
        return path


class _FakeRayTrain(types.ModuleType):
    """``ray.train`` in one worker: ``report`` keeps a copy of each checkpoint (Ray's upload),
    ``get_checkpoint`` is the latest (v2's: it moves on with each report)."""

    Checkpoint = _FakeCheckpoint

    def __init__(self, storage):
        super().__init__("ray.train")
        self.storage, self.reports, self.latest, self.uploads = storage, [], None, 0

    def report(self, metrics, checkpoint=None, delete_local_checkpoint_after_upload=False):
        kept = None
        if checkpoint is not None:
            self.uploads += 1
            kept = _FakeCheckpoint(shutil.copytree(checkpoint.path, self.storage / f"checkpoint_{self.uploads}"))
            self.latest = kept
        self.reports.append((metrics, kept))

    def get_checkpoint(self):
        return self.latest

    def steps(self):
        return [metrics["step"] for metrics, _ in self.reports]


@pytest.fixture
def ray_worker(monkeypatch, tmp_path):
    """This process as the one worker of a Ray Train run, with Ray's API faked (``new_process``:
    the worker process a restart starts: its count of fits and Ray's checkpoint found anew)."""
    from framework.callbacks import ray_report
    from framework.trainer import checkpointing

    train = _FakeRayTrain(tmp_path / "storage")
    ray = types.ModuleType("ray")
    ray.train = train
    monkeypatch.setitem(sys.modules, "ray", ray)
    monkeypatch.setitem(sys.modules, "ray.train", train)
    for key, value in {"RAY_RAYLET_PID": "1", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
                       "LOCAL_WORLD_SIZE": "1", "NODE_RANK": "0", "MASTER_ADDR": "127.0.0.1"}.items():
        monkeypatch.setenv(key, value)

    def new_process():
        monkeypatch.setattr(checkpointing, "_fits_in_this_process", 0)
        monkeypatch.setattr(ray_report, "_found_at_start", [])
        monkeypatch.setattr(ray_report, "_downloaded", [])
        train.reports = []

    new_process()
    train.new_process = new_process
    return train


class _Linear(fw.TrainModule):
    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return ((self.layer(x) - y) ** 2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _data(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(32, 4, generator=g),
                                                                      torch.randn(32, 1, generator=g)), batch_size=4)


def _fit(tmp_path, seed=0, data=0, **kwargs):
    model = _Linear(seed)
    kwargs.setdefault("callbacks", [RayTrainReport(every_n_train_steps=1)])
    trainer = fw.Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(tmp_path), **kwargs)
    assert trainer.environment.name == "ray"
    trainer.fit(model, _data(data))
    return model.layer.weight.detach().clone()


def test_no_report_partway_through_gradient_accumulation(ray_worker, tmp_path):
    # 8 batches, 2 to a step: a report (with its checkpoint) only on the batch that completed a step,
    # never at step 0 (an untrained model, half a window) nor on the first batch after a resume
    reference = _fit(tmp_path, accumulate_grad_batches=2)
    assert ray_worker.steps() == [1, 2, 3, 4]
    ray_worker.latest = ray_worker.reports[0][1]  # Ray restarts the workers after step 1
    ray_worker.new_process()
    resumed = _fit(tmp_path, seed=1, accumulate_grad_batches=2)
    assert ray_worker.steps() == [2, 3, 4]
    assert torch.equal(resumed, reference)  # the checkpoint reported at step 1 resumes exactly


def test_a_fit_stopped_partway_through_an_accumulation_window_reports_no_checkpoint_there(ray_worker, tmp_path,
                                                                                         caplog):
    class StopAt(fw.Callback):  # max_time, a callback's should_stop: after any batch
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            trainer.should_stop = batch_idx == 4  # the first batch of step 3's window

    _fit(tmp_path, accumulate_grad_batches=2, callbacks=[RayTrainReport(every_n_train_steps=4), StopAt()])
    assert ray_worker.steps() == []  # step 2's state with half of step 3's gradients would not resume exactly
    assert "did not complete an optimizer step" in caplog.text
    _fit(tmp_path, accumulate_grad_batches=2, callbacks=[RayTrainReport(every_n_train_steps=4), StopAt()],
         max_steps=2)
    assert ray_worker.steps() == [2]  # max_steps ends after a window: reported where it ended


def test_a_downloaded_copy_of_rays_checkpoint_goes_once_loaded(ray_worker, tmp_path):
    reference = _fit(tmp_path)
    remote = _FakeCheckpoint(ray_worker.reports[2][1].path, remote=True)  # in object storage: downloaded
    ray_worker.latest = remote
    ray_worker.new_process()
    resumed = _fit(tmp_path, seed=1)
    assert ray_worker.steps() == [4, 5, 6, 7, 8]  # it resumed from the copy (step 3)
    assert torch.equal(resumed, reference)
    assert len(remote.downloads) == 1 and not os.path.exists(remote.downloads[0])


def test_each_fit_of_a_program_resumes_only_from_its_own_checkpoint(ray_worker, tmp_path):
    # a program that fits twice (pretraining, then fine-tuning another model on other data)
    first = _fit(tmp_path, seed=0, data=0)
    second = _fit(tmp_path, seed=2, data=1)
    assert ray_worker.steps() == list(range(1, 9)) * 2  # the second fit did not resume from the first's
    ray_worker.latest = ray_worker.reports[8 + 4][1]  # the second fit's step 5: then Ray restarts the workers
    ray_worker.new_process()
    assert torch.equal(_fit(tmp_path, seed=0, data=0), first)  # the first fit runs again from its start
    assert torch.equal(_fit(tmp_path, seed=2, data=1), second)  # the second resumes from its step 5
    assert ray_worker.steps() == [*range(1, 9), 6, 7, 8]


def test_report_keeps_no_local_copy_only_where_rays_report_can(ray_worker):
    from framework.callbacks.ray_report import _keep_no_local_copy

    assert _keep_no_local_copy(ray_worker) == {"delete_local_checkpoint_after_upload": True}
    assert _keep_no_local_copy(types.SimpleNamespace(report=lambda metrics, checkpoint=None: None)) == {}
