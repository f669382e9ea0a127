"""The URL layer (framework/paths.py) with fsspec's in-memory file system, in this process: which
paths are URLs, the small file operations on a URL, storage_options by bucket, a missing bucket's
one line; and a short fit to ``memory://`` whose checkpoints, index and logs are there (and
nothing on the local disk), resumed from ``ckpt_path="last"`` bit for bit, with its uploads made
in the save or in the background (``async_upload``)."""

from __future__ import annotations

import io
import os
import uuid

import pytest
import torch
from lightning.modules import QUIET, make_regressor, regression_loader

import framework as fw
import framework.loggers as fw_loggers
from framework import paths
from framework.callbacks import ModelCheckpoint
from framework.checkpointing import index
from framework.errors import ConfigError

fsspec = pytest.importorskip("fsspec")


@pytest.fixture
def root() -> str:
    """A fresh folder of the in-memory file system (it lives as long as this process)."""
    return f"memory://fw-{uuid.uuid4().hex[:8]}"


@pytest.mark.parametrize(("path", "url"), [("runs/x", False), ("/tmp/x", False), ("C:/x", False),
                                           ("file:///tmp/x", False), ("file://otherhost/x", True),
                                           ("s3://bucket/run", True), ("memory://x", True), (None, False)])
def test_which_paths_are_urls(path, url):
    assert paths.is_url(path) is url


def test_storage_path_keeps_a_url_and_makes_a_file_url_local(root):
    assert paths.storage_path(root + "/run/", "key") == root + "/run"
    assert paths.storage_path("file:///tmp/run", "key") == "/tmp/run"
    with pytest.raises(ConfigError, match=r"^key='zzz://a/b': Protocol not known: zzz"):
        paths.storage_path("zzz://a/b", "key")


def test_file_operations_on_a_url(root):
    target = paths.join(root, "ck", "a.ckpt")
    assert target == f"{root}/ck/a.ckpt" and paths.dirname(target) == f"{root}/ck"
    assert not paths.exists(target) and paths.listdir(paths.join(root, "ck")) == []
    paths.write_bytes(target, b"data")
    paths.write_text(paths.join(root, "ck", "b.yaml"), "x: 1\n")
    assert paths.read_bytes(target) == b"data" and paths.isfile(target) and paths.isdir(paths.join(root, "ck"))
    assert sorted(paths.listdir(paths.join(root, "ck"))) == ["a.ckpt", "b.yaml"]
    assert paths.glob(paths.join(root, "**", "*.ckpt"), recursive=True) == [target]  # the URL as given
    assert paths.stamp(target)[0] == 4 and paths.modified(target) > 0
    assert paths.new_record(paths.join(root, "ck"), "b") == f"{root}/ck/b-1.yaml"  # never over b.yaml
    paths.remove(paths.join(root, "ck"))
    assert not paths.exists(target)


def test_storage_options_are_kept_by_bucket():
    paths.use_storage_options("s3://fw-options-test/run", {"key": "k", "secret": "s"})
    try:
        assert paths.options_for("s3://fw-options-test/other/x.ckpt") == {"key": "k", "secret": "s"}
        assert paths.options_for("s3://fw-options-test-2/x") == {}
        paths.use_storage_options("/local/run", {"key": "ignored"})  # a local path takes none
        with pytest.raises(ConfigError, match="must be a mapping"):
            paths.use_storage_options("s3://fw-options-test/run", "key=k")  # type: ignore[arg-type]
    finally:
        paths._OPTIONS.pop("s3://fw-options-test", None)


def test_only_an_object_store_needs_its_bucket_first(root):
    paths.check_storage(root + "/run", "trainer.default_root_dir")  # memory:// makes folders as it writes
    assert not paths.exists(root)  # and the check made none


class Logged(make_regressor(fw.TrainModule)):
    def training_step(self, batch, batch_idx):
        self.log("loss", loss := self.mse(batch))
        return loss


def _fit(root: str, max_epochs: int, ckpt_path: str | None = None, **trainer) -> fw.Trainer:
    quiet = {**QUIET, "enable_checkpointing": True, "log_every_n_steps": 1, "max_epochs": max_epochs, **trainer}
    fit = fw.Trainer(**quiet, default_root_dir=root,
                     callbacks=[ModelCheckpoint(save_last=True, monitor="loss")])
    fit.fit(Logged(), regression_loader(), ckpt_path=ckpt_path)
    return fit


@pytest.mark.procs  # no process, but 2-3 s of fits: out of the fast tier, which is at its limit
@pytest.mark.timeout(60)
@pytest.mark.parametrize("async_upload", [False, True], ids=["uploaded", "uploaded-in-background"])
def test_a_fit_to_memory_writes_there_and_resumes_from_last_bit_exactly(root, tmp_path, async_upload):
    _fit(root, 2, logger=fw_loggers.CSVLogger(flush_logs_every_n_steps=1), async_upload=async_upload)
    folder = f"{root}/fw_logs/version_0"
    assert sorted(paths.listdir(folder + "/checkpoints")) == [".fw-checkpoints.json", "epoch=1-step=8.ckpt",
                                                                 "last.ckpt"]
    assert paths.read_bytes(folder + "/metrics.csv").decode().startswith("step,")
    noted = index._read_url(folder + "/checkpoints")
    assert noted["last.ckpt"]["size"] == paths.stamp(folder + "/checkpoints/last.ckpt")[0]
    resumed = _fit(root, 3, ckpt_path="last", logger=False, async_upload=async_upload)
    straight = _fit(f"{root}-straight", 3, logger=False)
    assert resumed.ckpt_path == f"{folder}/checkpoints/last.ckpt" and resumed.global_step == 12
    for name, tensor in straight.lightning_module.state_dict().items():
        assert torch.equal(resumed.lightning_module.state_dict()[name], tensor), name
    saved = torch.load(io.BytesIO(paths.read_bytes(f"{root}/checkpoints/last.ckpt")), weights_only=True)
    assert saved["global_step"] == 12
    assert os.listdir(tmp_path) == []  # nothing local, no folder 'memory:'


def test_the_search_in_a_bucket_takes_this_runs_newest_complete_checkpoint(root):
    """A restart's search (``newest_checkpoint_of_run``) and ``ckpt_path="last"`` list the bucket:
    the newest checkpoint of the run asked for, never a sharded folder without its commit mark
    (a save killed half-way, written in place in object storage) nor another run's."""
    from framework.checkpointing import search
    from framework.checkpointing.file import atomic_save

    folder = f"{root}/ck"
    for name, run_id in (("a.ckpt", "x"), ("b.ckpt", "x"), ("c.ckpt", "y")):
        checkpoint = {"state_dict": {}, "run_id": run_id, "fit_index": 0}
        atomic_save(checkpoint, f"{folder}/{name}")
        index.note(f"{folder}/{name}", checkpoint)
    paths.write_bytes(f"{folder}/d.ckpt/.metadata", b"half a save")  # newest, incomplete
    assert search.newest_checkpoint_of_run([folder], {"run_id": "x", "fit_index": 0}) == f"{folder}/b.ckpt"
    assert search.newest_checkpoint_of_run([folder], {"run_id": "y", "fit_index": 0}) == f"{folder}/c.ckpt"
    assert search.find_last_checkpoint([folder], root) == f"{folder}/c.ckpt"
    assert index._read_url(folder)["b.ckpt"]["order"] == 2  # what orders two uploads of one second
