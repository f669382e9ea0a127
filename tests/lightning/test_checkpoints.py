"""ModelCheckpoint as Lightning's, run side by side with pytorch_lightning in this process on the
same seed and data: which weights ``ckpt_path="best"`` / ``"last"`` load after a fit (when the
checkpoints were saved), and where a run resumed from another folder's checkpoint writes.

Lightning's resumed numbers are not compared: fw puts back the RNG states of the checkpoint (a
resume equals the run never stopped), Lightning does not, so their data orders part there."""

from __future__ import annotations

import importlib.util
import os
import shutil
import warnings

import pytest
import torch

import framework as fw
from framework.callbacks import ModelCheckpoint
from framework.errors import CheckpointError, ConfigError
from framework.rank_zero import FwWarning
from lightning.modules import make_boring

pytestmark = pytest.mark.skipif(importlib.util.find_spec("pytorch_lightning") is None,
                                reason="pytorch_lightning is not installed (pip install pytorch-lightning; "
                                       "a test-only dependency)")

# use_distributed_sampler=False: the shuffled loader's own order, which Lightning reads in one
# process (fw's default is the order of any number of ranks: docs/lightning.md, "Where fw deliberately differs")
QUIET = dict(accelerator="cpu", devices=1, enable_progress_bar=False, enable_model_summary=False,
             log_every_n_steps=1, use_distributed_sampler=False)


def _lib(which: str):
    if which == "fw":
        return fw, fw.TrainModule, ModelCheckpoint, fw.Callback
    import pytorch_lightning as pl

    return pl, pl.LightningModule, pl.callbacks.ModelCheckpoint, pl.Callback


def _trainer(which: str, root, checkpoint: dict | None = None, **kwargs):
    lib, _, ModelCheckpoint, _ = _lib(which)
    callbacks = [ModelCheckpoint(**checkpoint)] if checkpoint is not None else []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's tips about its cloud services
        return lib.Trainer(default_root_dir=str(root), callbacks=callbacks, **{**QUIET, **kwargs})


def _fit_then_test(which: str, root, ckpt_path: str, checkpoint: dict | None, **kwargs) -> dict:
    lib, Base, _, _ = _lib(which)
    lib.seed_everything(7)
    model = make_boring(Base)()  # 16 steps an epoch, validation data of 5 batches
    trainer = _trainer(which, root, checkpoint, logger=False, **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model)
        fit = {k: float(v) for k, v in trainer.callback_metrics.items()}
        # ckpt_path None: test() without the model, after a fit: Lightning's default is the best checkpoint
        tested = trainer.test(model, ckpt_path=ckpt_path, verbose=False) if ckpt_path is not None else \
            trainer.test(verbose=False)
    loaded = torch.load(trainer.ckpt_path, weights_only=False)
    return {"fit": fit, "test": tested, "file": os.path.basename(trainer.ckpt_path), "step": loaded["global_step"],
            "steps": trainer.global_step}


@pytest.mark.parametrize(("ckpt_path", "checkpoint", "trainer_kwargs"), [
    # the default ModelCheckpoint under validation every 5 batches: saved after the last validation
    ("best", None, dict(max_epochs=1, check_val_every_n_epoch=None, val_check_interval=5)),
    ("last", dict(save_last=True), dict(max_epochs=1, check_val_every_n_epoch=None, val_check_interval=5)),
    ("best", dict(monitor="valid_loss"), dict(max_epochs=1, check_val_every_n_epoch=None, val_check_interval=5)),
    # a training metric monitored at each validation's end (4 times an epoch)
    ("best", dict(monitor="train_loss"), dict(max_epochs=1, val_check_interval=0.25)),
    # validation every second epoch: the epoch without it saves nothing
    ("best", None, dict(max_epochs=3, check_val_every_n_epoch=2)),
    ("last", dict(save_last=True), dict(max_epochs=3, check_val_every_n_epoch=2)),
    # validation once an epoch: saved at the training epoch's end, as before
    ("best", dict(monitor="valid_loss", save_last=True), dict(max_epochs=2)),
    # test() without a model: the best (here the first epoch's, by mode="max"), not the weights in memory
    (None, dict(monitor="valid_loss", mode="max"), dict(max_epochs=3)),
], ids=["best-every-5", "last-every-5", "monitored-every-5", "train-metric-quarters", "best-every-2nd-epoch",
        "last-every-2nd-epoch", "monitored-every-epoch", "no-model-means-best"])
def test_ckpt_path_loads_the_checkpoint_lightning_loads(tmp_path, ckpt_path, checkpoint, trainer_kwargs):
    ours = _fit_then_test("fw", tmp_path / "fw", ckpt_path, checkpoint, **trainer_kwargs)
    theirs = _fit_then_test("lightning", tmp_path / "pl", ckpt_path, checkpoint, **trainer_kwargs)
    assert ours["fit"] == theirs["fit"]  # the fit itself is Lightning's...
    assert (ours["file"], ours["step"]) == (theirs["file"], theirs["step"])  # ...and so is what it saved when
    assert ours["test"] == theirs["test"]
    if ckpt_path is None:
        assert ours["step"] < ours["steps"]  # an earlier checkpoint than the weights the fit ended with


def test_a_test_without_a_model_or_a_best_checkpoint_is_refused_as_lightning_refuses_it(tmp_path):
    """After a fit without ModelCheckpoint, ``test()`` without the model has no best checkpoint to
    run; Lightning refuses rather than scoring the weights in memory, and so does fw."""
    for which, error in (("fw", ConfigError), ("lightning", ValueError)):
        lib, Base, _, _ = _lib(which)
        lib.seed_everything(7)
        model = make_boring(Base)()
        trainer = _trainer(which, tmp_path / which, logger=False, max_epochs=1, enable_checkpointing=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(model)
            with pytest.raises(error, match="ModelCheckpoint"):
                trainer.test(verbose=False)


def test_best_without_any_save_point_is_refused_as_lightning_refuses_it(tmp_path):
    """One epoch, validation every second epoch: no save point came, so there is no "best"."""
    for which, error in (("fw", CheckpointError), ("lightning", ValueError)):
        lib, Base, _, _ = _lib(which)
        lib.seed_everything(7)
        model = make_boring(Base)()
        trainer = _trainer(which, tmp_path / which, logger=False, max_epochs=1, check_val_every_n_epoch=2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(model)
            with pytest.raises(error, match="best"):
                trainer.test(model, ckpt_path="best", verbose=False)


# -- a resume from another folder -------------------------------------------------------------------
def _files(top) -> dict[str, tuple[int, int]]:
    return {os.path.join(d, f): (os.stat(os.path.join(d, f)).st_size, os.stat(os.path.join(d, f)).st_mtime_ns)
            for d, _, names in os.walk(top) for f in names}


def _resume_elsewhere(which: str, top, checkpoint: dict, delete_first_root: bool, existing_version: bool,
                      **trainer_args) -> dict:
    """Fit 2 epochs under ``top/A``, resume for a 3rd under ``top/B``; what the resumed
    ModelCheckpoint held once restored, what it ended with, and which files changed."""
    lib, Base, _, Callback = _lib(which)
    first, second = top / "A", top / "B"
    lib.seed_everything(7)
    trainer = _trainer(which, first, checkpoint, max_epochs=2, **trainer_args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(make_boring(Base)())
    ckpt = trainer.checkpoint_callback.last_model_path or trainer.checkpoint_callback.best_model_path
    if delete_first_root:
        ckpt = str(shutil.copy(ckpt, top / "kept.ckpt"))
        shutil.rmtree(first)
    if existing_version:  # another run's folder: the resumed run is a new version beside it
        name = "fw_logs" if which == "fw" else "lightning_logs"
        os.makedirs(second / name / "version_0")
    restored = {}

    class Probe(Callback):
        def on_train_start(self, trainer, module):
            cb = trainer.checkpoint_callback
            restored.update(dirpath=cb.dirpath, best_model_path=cb.best_model_path,
                            best_model_score=cb.best_model_score, best_k_models=dict(cb.best_k_models),
                            kth_best_model_path=cb.kth_best_model_path, last_model_path=cb.last_model_path)

    before = _files(top)
    lib.seed_everything(7)
    trainer = _trainer(which, second, checkpoint, max_epochs=3, **trainer_args)
    trainer.callbacks.insert(0, Probe())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(make_boring(Base)(), ckpt_path=ckpt)
    after = _files(top)
    cb = trainer.checkpoint_callback
    return {"restored": restored, "root": str(second), "first": str(first), "ckpt": ckpt,
            "log_dir": trainer.log_dir, "dirpath": cb.dirpath, "best_model_path": cb.best_model_path,
            "best_k_models": sorted(cb.best_k_models), "last_model_path": cb.last_model_path,
            "changed": sorted(p for p in after if before.get(p) != after[p]),
            "gone": sorted(p for p in before if p not in after),
            "warnings": [str(w.message) for w in caught if issubclass(w.category, FwWarning)]}


def _relative(path: str, run: dict) -> str:
    """A path as seen from its run's roots, the logger folder named alike for fw and Lightning."""
    if not path:
        return path
    for root, label in ((run["root"], "B"), (run["first"], "A")):
        if path.startswith(root + os.sep):
            return label + "/" + os.path.relpath(path, root).replace("lightning_logs", "fw_logs")
    return os.path.relpath(path, os.path.dirname(run["root"]))


@pytest.mark.parametrize(("checkpoint", "delete_first_root", "existing_version"), [
    ({}, False, True),  # the default ModelCheckpoint; B already holds another run's version_0
    (dict(monitor="valid_loss", save_top_k=2, save_last=True), True, False),  # top-k to drop; A deleted
], ids=["default-A-kept", "top2-A-deleted"])
def test_a_run_resumed_from_another_folder_writes_only_under_its_own_root(tmp_path, checkpoint, delete_first_root,
                                                                        existing_version):
    ours = _resume_elsewhere("fw", tmp_path / "fw", checkpoint, delete_first_root, existing_version)
    theirs = _resume_elsewhere("lightning", tmp_path / "pl", checkpoint, delete_first_root, existing_version)

    # every file the resumed run wrote is under B; nothing of A was changed, deleted or re-created
    assert ours["changed"] and all(p.startswith(ours["root"] + os.sep) for p in ours["changed"]), ours["changed"]
    assert ours["gone"] == [] and os.path.exists(ours["first"]) is not delete_first_root
    version = "version_1" if existing_version else "version_0"  # a new version under the new root
    assert _relative(ours["log_dir"], ours) == _relative(theirs["log_dir"], theirs) == f"B/fw_logs/{version}"
    # the state the resumed ModelCheckpoint starts from, and ends with, is Lightning's
    for key in ("dirpath", "best_model_path", "last_model_path", "kth_best_model_path"):
        assert _relative(ours["restored"][key], ours) == _relative(theirs["restored"][key], theirs), key
    assert ours["restored"]["dirpath"] == os.path.join(ours["root"], "fw_logs", version, "checkpoints")
    assert ours["restored"]["best_model_score"] is theirs["restored"]["best_model_score"] is None
    assert ours["restored"]["best_k_models"] == theirs["restored"]["best_k_models"] == {}
    for key in ("dirpath", "best_model_path", "last_model_path"):
        assert _relative(ours[key], ours) == _relative(theirs[key], theirs), key
    assert [_relative(p, ours) for p in ours["best_k_models"]] == \
        [_relative(p, theirs) for p in theirs["best_k_models"]]
    # said once, in one line: where the old run saved, where this one saves, what was not restored
    said = [w for w in ours["warnings"] if "top-k does not go on" in w]
    assert len(said) == 1 and "\n" not in said[0]
    assert ours["first"] in said[0] and ours["restored"]["dirpath"] in said[0] and "Only best_model_path" in said[0]
    if checkpoint.get("save_top_k") == 2:
        assert "no longer exists" in said[0] and "best_k_models (2 files)" in said[0] and "last_model_path" in said[0]


@pytest.mark.parametrize("checkpoint", [{}, dict(monitor="valid_loss", save_top_k=2, save_last=True)],
                         ids=["default", "top2"])
def test_without_a_logger_a_run_resumed_from_a_sibling_folder_writes_only_under_its_own_root(tmp_path, checkpoint):
    """logger=False: the run folder is default_root_dir/checkpoints, which has no versions, so a
    checkpoint from a sibling folder (A beside B) is another run's: its top-k does not go on there
    (fw took A for another version of B's run, saved into A and pruned A's files)."""
    ours = _resume_elsewhere("fw", tmp_path / "fw", checkpoint, False, False, logger=False)
    theirs = _resume_elsewhere("lightning", tmp_path / "pl", checkpoint, False, False, logger=False)

    assert ours["changed"] and all(p.startswith(ours["root"] + os.sep) for p in ours["changed"]), ours["changed"]
    assert ours["gone"] == []
    assert _relative(ours["dirpath"], ours) == _relative(theirs["dirpath"], theirs) == "B/checkpoints"
    for key in ("best_model_path", "last_model_path"):
        assert _relative(ours[key], ours) == _relative(theirs[key], theirs), key


def _evaluated_from_a_checkpoint(which: str, root) -> dict:
    """A fit that saves, then a fresh Trainer's validate(ckpt_path=...) and test(ckpt_path=...):
    the callbacks' states as the checkpoint had them (Lightning restores them for evaluation too)."""
    lib, Base, ModelCheckpoint, Callback = _lib(which)

    class Counter(Callback):
        def __init__(self) -> None:
            self.batches, self.loaded = 0, []

        def on_train_batch_end(self, *args) -> None:
            self.batches += 1

        def state_dict(self) -> dict:
            return {"batches": self.batches}

        def load_state_dict(self, state: dict) -> None:
            self.batches = state["batches"]

        def on_load_checkpoint(self, trainer, module, checkpoint) -> None:
            self.loaded.append(checkpoint["global_step"])

    def callbacks() -> list:
        return [Counter(), lib.callbacks.EarlyStopping(monitor="valid_loss", patience=5),
                ModelCheckpoint(monitor="valid_loss", save_top_k=2, mode="max")]

    lib.seed_everything(7)
    model = make_boring(Base)()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = lib.Trainer(default_root_dir=str(root), callbacks=callbacks(), logger=False, max_epochs=3, **QUIET)
        trainer.fit(model)
        path = trainer.checkpoint_callback.best_model_path  # the first epoch's (mode="max")
        out = {}
        for fn in ("validate", "test"):
            counter, stopping, checkpoint = cbs = callbacks()
            fresh = lib.Trainer(default_root_dir=str(root), callbacks=cbs, logger=False, **QUIET)
            getattr(fresh, fn)(model, ckpt_path=path, verbose=False)
            out[fn] = {"counter": (counter.batches, counter.loaded), "stopping": (stopping.wait_count,
                       float(stopping.best_score)), "best": (os.path.basename(checkpoint.best_model_path),
                       float(checkpoint.best_model_score)), "top": sorted(map(os.path.basename, checkpoint.best_k_models))}
    return out


def test_validate_and_test_from_a_checkpoint_restore_the_callbacks_as_lightning_does(tmp_path):
    ours, theirs = _evaluated_from_a_checkpoint("fw", tmp_path / "fw"), _evaluated_from_a_checkpoint("pl", tmp_path / "pl")
    assert ours == theirs
    assert ours["validate"]["counter"] == (16, [16])  # the first epoch's 16 batches, its hook called once


def _files_saved_by_a_metric_with_a_slash(which: str, root) -> tuple[list[str], str]:
    from torch.utils.data import DataLoader

    from lightning.modules import make_summing, sum_data

    lib, Base, ModelCheckpoint, _ = _lib(which)

    class Slashed(make_summing(Base, lr=0.05)):
        def training_step(self, batch, batch_idx):
            return self.mse(batch)

        def validation_step(self, batch, batch_idx):
            self.log("val/loss", self.mse(batch))

    checkpoint = ModelCheckpoint(dirpath=str(root), filename="{epoch}-{val/loss:.3f}", monitor="val/loss",
                                 save_top_k=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = lib.Trainer(callbacks=[checkpoint], logger=False, max_epochs=4, **QUIET)
        loader = DataLoader(sum_data(16), batch_size=4)
        trainer.fit(Slashed(), loader, loader)
    saved = sorted(os.path.relpath(os.path.join(folder, name), root) for folder, _, names in os.walk(root)
                   for name in names if name.endswith(".ckpt"))
    return saved, os.path.relpath(checkpoint.best_model_path, root)


def test_a_metric_name_with_a_slash_saves_into_a_folder_as_lightning_does(tmp_path):
    ours = _files_saved_by_a_metric_with_a_slash("fw", tmp_path / "fw")
    assert ours == _files_saved_by_a_metric_with_a_slash("pl", tmp_path / "pl")
    assert len(ours[0]) == 2 and all(path.startswith("epoch=") and "-val/loss=" in path for path in ours[0])
