"""Object storage when a write fails, and the edges of the URL layer (framework/paths.py), with
fsspec's in-memory file system, in this process: a failed background upload is raised in the
training thread at the next save (one line naming its URL), one checkpoint at most waits for its
upload, ``save_checkpoint`` outside a fit returns after its upload; a log upload that fails
never costs the local copy nor writes a row twice; ``~`` in local paths as before URLs were
read; no local folder named after a URL (profiler output, chained URLs); the user's URL form
kept in listings; ``storage_options`` and ``async_upload`` of one Trainer only."""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import uuid

import pytest
from lightning.modules import QUIET, make_regressor, regression_loader

import framework as fw
import framework.loggers  # fw.loggers
from framework import paths
from framework.callbacks import ModelCheckpoint
from framework.errors import CheckpointError, ConfigError

fsspec = pytest.importorskip("fsspec")
from fsspec.implementations.memory import MemoryFileSystem  # noqa: E402  # after the importorskip


@pytest.fixture
def root() -> str:
    """A fresh folder of the in-memory file system (it lives as long as this process)."""
    return f"memory://fw-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def background(root):
    """``root``'s bucket uploads in the background while the test runs."""
    paths.upload_in_background(root)
    try:
        yield root
    finally:
        paths.upload_in_background(root, on=False)
        with contextlib.suppress(CheckpointError):  # what the test left failing
            paths.wait_for_uploads()


def test_a_failed_background_upload_is_raised_by_the_next_write_naming_its_url(background):
    first, second = f"{background}/a.ckpt", f"{background}/b.ckpt"

    def fail() -> None:
        raise PermissionError("403 token expired")

    paths.later(first, fail, exists=True, one_at_a_time=True)
    ran = []
    with pytest.raises(CheckpointError, match=rf"^the background upload of '{first}' failed \(PermissionError: 403 "):
        paths.later(second, lambda: ran.append(second), exists=True, one_at_a_time=True)
    paths.wait_for_uploads()  # raised once: nothing more to say
    assert ran == [] and not paths.exists(second)  # the save that raised queued nothing


def test_a_checkpoint_upload_waits_for_the_one_before(background):
    """One serialised checkpoint at most waits in memory: the next save waits for the upload before."""
    release, started = threading.Event(), threading.Event()
    done = []

    def slow() -> None:
        started.set()
        release.wait(10)
        done.append("first")

    paths.later(f"{background}/a.ckpt", slow, one_at_a_time=True)
    assert started.wait(10)
    threading.Timer(0.3, release.set).start()
    paths.later(f"{background}/b.ckpt", lambda: done.append("second"), one_at_a_time=True)
    assert done == ["first"]  # the call returned once the first upload had finished, the second queued
    paths.wait_for_uploads()
    assert done == ["first", "second"]


class Logged(make_regressor(fw.TrainModule)):
    def training_step(self, batch, batch_idx):
        self.log("loss", loss := self.mse(batch))
        return loss


@pytest.mark.procs  # no process, but a fit or two: out of the fast tier, which is at its limit
@pytest.mark.timeout(60)
def test_a_failed_upload_stops_the_fit_at_the_next_save_and_save_checkpoint_waits(root, monkeypatch):
    original, calls = MemoryFileSystem.pipe_file, []

    def second_checkpoint_fails(self, path, *args, **kwargs):
        if path.endswith(".ckpt"):
            calls.append(path)
            if len(calls) == 2:
                raise OSError("503 slow down")
        return original(self, path, *args, **kwargs)

    monkeypatch.setattr(MemoryFileSystem, "pipe_file", second_checkpoint_fails)
    trainer = fw.Trainer(**{**QUIET, "enable_checkpointing": True}, default_root_dir=root, max_steps=8,
                         async_upload=True, callbacks=[ModelCheckpoint(every_n_train_steps=1, save_top_k=-1)])
    try:
        with pytest.raises(CheckpointError, match=r"^the background upload of '.*epoch=0-step=2\.ckpt' failed "
                                                  r"\(OSError: 503 slow down\)"):
            trainer.fit(Logged(), regression_loader())
        assert trainer.global_step == 3  # the save after the failed upload raised it, not the fit's end
        in_bucket = [url.rsplit("/", 1)[1] for url in paths.glob(f"{root}/**/*.ckpt", recursive=True)]
        assert in_bucket == ["epoch=0-step=1.ckpt"]  # the upload after the failed one was not queued
        monkeypatch.setattr(MemoryFileSystem, "pipe_file",
                            lambda *a, **k: (_ for _ in ()).throw(PermissionError("403 token expired")))
        with pytest.raises(CheckpointError, match=r"^the background upload of '.*final\.ckpt' failed"):
            trainer.save_checkpoint(f"{root}/final.ckpt")  # outside a fit: it returns after its upload, or raises
    finally:
        paths.upload_in_background(root, on=False)


def _fail_uploads(monkeypatch, times: int | None = None) -> None:
    """``put_file`` (a log upload) raises, ``times`` times or always."""
    original, left = MemoryFileSystem.put_file, [times]

    def put_file(self, *args, **kwargs):
        if left[0] is None or left[0] > 0:
            left[0] = None if left[0] is None else left[0] - 1
            raise PermissionError("403 token expired")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(MemoryFileSystem, "put_file", put_file)


def test_a_routine_log_upload_that_fails_writes_no_row_twice(root, monkeypatch, recwarn):
    logger = fw.loggers.CSVLogger(root, name="x")
    logger.PUBLISH_EVERY = 0.0
    _fail_uploads(monkeypatch, times=1)
    logger.log_metrics({"a": 1.0}, step=0)
    logger.save()  # written locally, its upload fails
    logger.log_metrics({"a": 2.0}, step=1)
    logger.save()
    logger.finalize("success")
    assert paths.read_bytes(logger.metrics_file_path).decode().splitlines() == ["step,a", "0,1.0", "1,2.0"]
    assert [str(w.message).count("uploading the logs") for w in recwarn] == [1]  # said once


@pytest.mark.parametrize("kind", ["CSVLogger", "TensorBoardLogger"])
def test_a_failed_last_log_upload_keeps_the_local_copy_and_names_it(root, monkeypatch, recwarn, kind):
    logger = getattr(fw.loggers, kind)(root, name="x")
    logger.log_metrics({"a": 1.0}, step=0)
    logger.save()
    local = logger.local_dir
    _fail_uploads(monkeypatch)
    logger.finalize("success")
    kept = sorted(os.listdir(local))
    assert any(name.startswith(("metrics.csv", "events.out")) for name in kept), kept  # nothing a user logged is lost
    warnings = [str(w.message) for w in recwarn if "uploading the logs" in str(w.message)]
    assert len(warnings) == 1 and "\n" not in warnings[0]
    assert f"they are kept in '{local}'" in warnings[0] and f"copy that folder to '{logger.log_dir}'" in warnings[0]
    monkeypatch.undo()
    shutil.rmtree(local)


def test_a_tilde_in_local_paths_is_what_it_was_before_urls(tmp_path, monkeypatch):
    """``default_root_dir="~/runs"``: the checkpoints and the logs in one folder ``./~/runs`` (fw
    before URLs were read); a ModelCheckpoint ``dirpath`` expands ``~`` (Lightning's, fw's before)."""
    import framework.callbacks.checkpoint_files as files

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    trainer = fw.Trainer(**QUIET, default_root_dir="~/runs", logger=fw.loggers.CSVLogger(None))
    trainer.loggers[0].set_default_root(trainer.default_root_dir)
    assert files.run_folder(trainer) == str(tmp_path / "~" / "runs" / "fw_logs" / "version_0" / "checkpoints")
    assert os.path.realpath(trainer.log_dir) == str(tmp_path / "~" / "runs" / "fw_logs" / "version_0")
    assert ModelCheckpoint(dirpath="~/ck").dirpath == str(tmp_path / "home" / "ck")
    assert paths.real("~/x") == str(tmp_path / "~" / "x")


@pytest.mark.procs  # no process, but a Trainer's fit set up: out of the fast tier
@pytest.mark.timeout(60)
def test_a_profiler_writing_files_into_a_url_run_folder_is_refused_and_writes_nothing_local(root, tmp_path,
                                                                                           monkeypatch):
    from framework.profilers import SimpleProfiler

    monkeypatch.chdir(tmp_path)
    trainer = fw.Trainer(**QUIET, default_root_dir=root, profiler=SimpleProfiler(filename="perf"), logger=False)
    with pytest.raises(ConfigError, match=rf"^SimpleProfiler dirpath is not set and the run folder '{root}' is object "
                                          r"storage, .*give a local folder: SimpleProfiler\(dirpath='profiler', ...\)$"):
        trainer.fit(Logged(), regression_loader())
    assert os.listdir(tmp_path) == []  # no folder 'memory:'


def test_a_profiler_in_a_url_run_folder_writes_its_files_only_into_a_local_dirpath(root, tmp_path):
    from framework.profilers import AdvancedProfiler, SimpleProfiler

    with pytest.raises(ConfigError, match=r"^AdvancedProfiler dirpath is not set"):
        AdvancedProfiler(dump_stats=True).setup("fit", None, root)
    to_the_log = SimpleProfiler()  # no file: its report goes to the log, as with a local run folder
    to_the_log.setup("fit", None, root)
    assert to_the_log.dirpath is None
    local = SimpleProfiler(dirpath=tmp_path / "profiler", filename="perf")
    local.setup("fit", None, root)
    assert local.dirpath == str(tmp_path / "profiler")


class _Rank:
    """What ``wait_for_uploads_on_every_rank`` asks of a strategy, as rank ``rank`` of two sees it,
    the other rank's outcome given (the gather of a live 2-rank group)."""

    is_distributed, world_size = True, 2

    def __init__(self, rank: int, others: str | None) -> None:
        self.rank, self.others = rank, others

    def all_gather_object(self, mine):
        return [mine, self.others] if self.rank == 0 else [self.others, mine]


def test_a_failed_upload_is_the_same_error_on_every_rank_never_one_rank_alone(background, monkeypatch):
    """Rank 0 uploads (FSDP's fw_state.pt, the checkpoints): its failure is raised on the rank
    that uploaded nothing too, before any barrier (a rank raising alone leaves the others waiting)."""
    import torch.distributed

    from framework.checkpointing.file import wait_for_uploads_on_every_rank

    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    failed = "the background upload of 'memory://b/x' failed (PermissionError: 403 token expired); ..."
    with pytest.raises(CheckpointError, match=r"^the background upload of 'memory://b/x' failed") as raised:
        wait_for_uploads_on_every_rank(_Rank(1, others=failed))  # nothing failed here: rank 0's failure
    assert raised.value.alike_on_every_rank  # one line, printed by rank 0
    paths.later(f"{background}/a.ckpt", lambda: (_ for _ in ()).throw(OSError("503")), one_at_a_time=True)
    with pytest.raises(CheckpointError, match=rf"^the background upload of '{background}/a.ckpt' failed"):
        wait_for_uploads_on_every_rank(_Rank(0, others=None))
    wait_for_uploads_on_every_rank(_Rank(0, others=None))  # raised once; nothing failed since


def test_storage_options_reach_every_url_of_a_trainer_and_no_later_trainer(root, monkeypatch):
    """A PredictionWriter's ``output_dir`` and a ``ckpt_path`` are read and written with the
    Trainer's ``storage_options``; a Trainer built later keeps none of an earlier one's options,
    nor its ``async_upload``."""
    from framework.callbacks import PredictionWriter

    options = {"key": "k", "secret": "s"}
    first = fw.Trainer(**QUIET, logger=False, default_root_dir=root, storage_options=options, async_upload=True,
                       callbacks=[PredictionWriter(output_dir=f"{root}-writer/predictions")])
    assert paths.options_for(f"{root}-writer/predictions/x.pt") == options  # another bucket
    assert paths.options_for(f"{root}/x") == options and paths._bucket(root) in paths._BACKGROUND
    seen = []
    monkeypatch.setattr(first, "_run_here", lambda call: seen.append(paths.options_for(call.ckpt_path)))
    first.validate(Logged(), regression_loader(), ckpt_path=f"{root}-other/run/last.ckpt")
    assert seen == [options]  # the checkpoint's bucket is read with them
    fw.Trainer(**QUIET, logger=False, default_root_dir=root)  # another Trainer, of the same bucket
    assert paths.options_for(f"{root}/x") == {} and paths.options_for(f"{root}-writer/p") == {}
    assert paths._bucket(root) not in paths._BACKGROUND  # its checkpoints are uploaded in the save again


def test_a_chained_url_is_refused_in_one_line_and_makes_no_local_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"^trainer.default_root_dir='simplecache::s3://b/run': chained fsspec URLs "
                                          r".*give the URL itself \(s3://bucket/run\)$"):
        fw.Trainer(**QUIET, default_root_dir="simplecache::s3://b/run")
    assert os.listdir(tmp_path) == []


def test_listed_urls_keep_the_users_form_so_pruning_finds_them(root):
    """``memory:///x`` (three slashes) lists as ``memory:///x/...``: what the prefix test of
    ``remove_if_ours`` and the best paths compare with."""
    import framework.callbacks.checkpoint_files as files

    triple = "memory:///" + root.removeprefix("memory://")
    paths.write_bytes(f"{triple}/ck/a.ckpt", b"a")
    assert paths.glob(f"{triple}/ck/*.ckpt") == [f"{triple}/ck/a.ckpt"]
    assert paths.glob(f"{root}/ck/*.ckpt") == [f"{root}/ck/a.ckpt"]
    files.remove_if_ours(paths.glob(f"{triple}/ck/*.ckpt")[0], f"{triple}/ck", is_global_zero=True)
    assert paths.listdir(f"{root}/ck") == []


def test_pruning_a_sharded_folder_in_a_bucket_removes_its_commit_mark_first(root, monkeypatch):
    """A prune killed half-way never leaves a folder that looks complete without all its shards."""
    import framework.callbacks.checkpoint_files as files

    folder = f"{root}/ck/epoch=0-step=1.ckpt"
    for name in ("COMMITTED", ".metadata", "__0_0.distcp", "fw_state.pt"):
        paths.write_bytes(f"{folder}/{name}", b"x")
    removed = []
    original = MemoryFileSystem.rm

    def rm(self, path, *args, **kwargs):
        removed.append(path.rsplit("/", 1)[1])
        return original(self, path, *args, **kwargs)

    monkeypatch.setattr(MemoryFileSystem, "rm", rm)
    files.remove_if_ours(folder, f"{root}/ck", is_global_zero=True)
    assert removed[0] == "COMMITTED" and not paths.exists(folder)
