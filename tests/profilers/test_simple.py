"""``Trainer(profiler="simple")``: every hook fw calls is timed under Lightning's action name, with
as many calls as Lightning's SimpleProfiler counts for the same module; the report goes to
stderr, or to ``{stage}-{filename}.txt`` in the run folder; without a profiler nothing is wrapped."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

import framework as fw
from framework.errors import ConfigError
from framework.loggers import CSVLogger
from framework.profilers import AdvancedProfiler, PassThroughProfiler, SimpleProfiler
from tests.profilers.models import CALLBACK_HOOKS, MODEL_HOOKS, callback_class, data_class, loaders, model_class

QUIET = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
             accelerator="cpu", devices=1)
FIT = dict(max_epochs=2, gradient_clip_val=1.0, num_sanity_val_steps=2)

TRAIN_BATCHES, VAL_BATCHES, SANITY = 10, 2 * 3, 2  # 2 epochs of 40/8, validation 24/8 after each
#: the calls each overridden hook gets in FIT, counted by hand
EXPECTED = {
    "on_fit_start": 1, "on_train_start": 1, "on_train_epoch_start": 2, "on_train_epoch_end": 2,
    "on_train_batch_start": TRAIN_BATCHES, "on_train_batch_end": TRAIN_BATCHES, "on_before_backward": TRAIN_BATCHES,
    "on_after_backward": TRAIN_BATCHES, "on_before_zero_grad": TRAIN_BATCHES, "on_before_optimizer_step": TRAIN_BATCHES,
    "on_validation_batch_end": VAL_BATCHES + SANITY, "on_validation_epoch_end": 3, "lr_scheduler_step": 2,
    "on_before_batch_transfer": TRAIN_BATCHES + VAL_BATCHES + SANITY,
    "on_after_batch_transfer": TRAIN_BATCHES + VAL_BATCHES + SANITY,
}
#: what both frameworks record besides the overridden hooks: the loops' own actions, the defaults both call
LOOP_ACTIONS = {
    "run_training_epoch": 2, "run_training_batch": TRAIN_BATCHES,
    "[_TrainingEpochLoop].train_dataloader_next": TRAIN_BATCHES, "[_EvaluationLoop].val_next": VAL_BATCHES + SANITY,
    "[Strategy]SingleDeviceStrategy.training_step": TRAIN_BATCHES,
    "[Strategy]SingleDeviceStrategy.validation_step": VAL_BATCHES + SANITY,
    "[Strategy]SingleDeviceStrategy.backward": TRAIN_BATCHES,
    "[Strategy]SingleDeviceStrategy.batch_to_device": TRAIN_BATCHES + VAL_BATCHES + SANITY,
    "[LightningModule]Model.optimizer_step": TRAIN_BATCHES, "[LightningModule]Model.optimizer_zero_grad": TRAIN_BATCHES,
    "[LightningModule]Model.configure_gradient_clipping": TRAIN_BATCHES,
    "[LightningModule]Model.configure_optimizers": 1, "[LightningModule]Model.configure_callbacks": 1,
    "[LightningDataModule]Data.setup": 1, "[LightningDataModule]Data.train_dataloader": 1,
    "[LightningDataModule]Data.val_dataloader": 1, "[LightningDataModule]Data.teardown": 1,
}
#: actions fw records and Lightning 2.6.6 does not, and why: fw calls these defaults (they do
#: nothing), Lightning calls them only when they are overridden
ONLY_FW = {"[LightningModule]Model.prepare_data", "[LightningDataModule]Data.prepare_data",
           "[LightningModule]Model.configure_model"}


def counts(profiler: SimpleProfiler) -> dict[str, int]:
    return {action: len(durations) for action, durations in profiler.recorded_durations.items()}


def fw_fit_counts() -> dict[str, int]:
    profiler = SimpleProfiler()
    trainer = fw.Trainer(profiler=profiler, callbacks=[callback_class(fw.Callback)()], **FIT, **QUIET)
    assert trainer.profiler is profiler
    trainer.fit(model_class(fw.TrainModule)(), datamodule=data_class(fw.DataModule)())
    return counts(profiler)


def test_every_hook_is_timed_as_often_as_lightning_times_it():
    pl = pytest.importorskip("pytorch_lightning")
    ours = fw_fit_counts()
    profiler = pl.profilers.SimpleProfiler()
    trainer = pl.Trainer(profiler=profiler, callbacks=[callback_class(pl.Callback)()], **FIT, **QUIET)
    trainer.fit(model_class(pl.LightningModule)(), datamodule=data_class(pl.LightningDataModule)())
    theirs = counts(profiler)

    hooks = {f"[LightningModule]Model.{hook}": n for hook, n in EXPECTED.items()}
    hooks |= {f"[Callback]Recorder.{hook}": 1 for hook in ("setup", "teardown")}
    hooks |= {f"[Callback]Recorder.{hook}": EXPECTED[hook] for hook in CALLBACK_HOOKS if hook in EXPECTED}
    assert set(hooks) >= {f"[LightningModule]Model.{hook}" for hook in MODEL_HOOKS}
    for action, n in {**hooks, **LOOP_ACTIONS}.items():
        assert (ours.get(action), theirs.get(action)) == (n, n), action
    common = ours.keys() & theirs.keys()
    assert {action: ours[action] for action in common} == {action: theirs[action] for action in common}
    assert ours.keys() - theirs.keys() == ONLY_FW
    for action in theirs.keys() - ours.keys():  # Lightning calls every hook; fw skips what nobody overrides
        hook = action.rpartition(".")[2]
        assert ((action.startswith("[LightningModule]Model.") and hook not in MODEL_HOOKS)
                or (action.startswith("[Callback]Recorder.") and hook not in CALLBACK_HOOKS)
                or action.startswith("[Strategy]SingleDeviceStrategy.on_")), action  # Lightning's strategy hooks


def test_the_report_goes_to_stderr_with_a_row_per_action(capsys):
    trainer = fw.Trainer(profiler="simple", max_epochs=2, **QUIET)
    assert isinstance(trainer.profiler, SimpleProfiler)
    trainer.fit(model_class(fw.TrainModule)(), *loaders())
    out, err = capsys.readouterr()
    assert "Profiler Report" not in out  # stdout is the user's
    assert "FIT Profiler Report" in err
    rows = dict(re.findall(r"^\|  (\S+)\s*\t\|  \S+\s*\t\|  (\d+)\s*\t\|", err, re.MULTILINE))
    assert rows["[LightningModule]Model.on_train_batch_start"] == str(TRAIN_BATCHES)
    assert rows["[LightningModule]Model.on_validation_epoch_end"] == "3"
    assert int(rows["Total"]) == sum(int(n) for action, n in rows.items() if action != "Total")


def test_reports_are_files_per_stage_in_the_run_folder(capsys, tmp_path):
    trainer = fw.Trainer(profiler=SimpleProfiler(filename="perf"), max_epochs=1, logger=CSVLogger(tmp_path),
                         enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1)
    model = model_class(fw.TrainModule)()
    train, val = loaders()
    trainer.fit(model, train, val)
    run_dir = Path(trainer.log_dir)
    assert run_dir.parent.parent == tmp_path  # the logger's version folder
    trainer.test(model, val, verbose=False)
    trainer.predict(model, val)
    assert "Profiler Report" not in capsys.readouterr().err
    fit_report = (run_dir / "fit-perf.txt").read_text()
    assert fit_report.startswith("FIT Profiler Report") and "[_TrainingEpochLoop].train_dataloader_next" in fit_report
    assert re.search(r"\|  save_checkpoint\s*\t\|  \S+\s*\t\|  1 ", fit_report)  # ModelCheckpoint, once
    assert re.search(r"\|  \[_EvaluationLoop\]\.test_next\s*\t\|  \S+\s*\t\|  3 ",
                     (run_dir / "test-perf.txt").read_text())
    assert re.search(r"\|  \[_PredictionLoop\]\.predict_next\s*\t\|  \S+\s*\t\|  3 ",
                     (run_dir / "predict-perf.txt").read_text())
    assert sorted(p.name for p in run_dir.glob("*-perf.txt")) == ["fit-perf.txt", "predict-perf.txt", "test-perf.txt"]


def test_manual_optimization_times_its_optimizer_steps():
    class Manual(model_class(fw.TrainModule)):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, batch, batch_idx):
            opt = self.optimizers()
            opt.zero_grad()
            self.manual_backward(super().training_step(batch, batch_idx))
            opt.step()

    profiler = SimpleProfiler()
    fw.Trainer(profiler=profiler, max_epochs=1, limit_val_batches=0, **QUIET).fit(Manual(), loaders()[0])
    found = counts(profiler)
    assert found["optimizer_step"] == found["[Strategy]SingleDeviceStrategy.backward"] == 5
    assert found["[Strategy]SingleDeviceStrategy.training_step"] == found["run_training_batch"] == 5


def test_without_a_profiler_the_hooks_are_called_unwrapped():
    seen = {}

    class Looks(fw.Callback):
        def on_train_start(self, trainer, module):
            hooks = trainer.run.hooks
            seen.update(profiler=hooks.profiler, batch_start=hooks.per_batch("on_train_batch_start"),
                        step=hooks.strategy_fn("training_step", module.training_step))

    model = model_class(fw.TrainModule)()
    trainer = fw.Trainer(max_epochs=1, callbacks=[Looks()], **QUIET)
    assert isinstance(trainer.profiler, PassThroughProfiler)
    trainer.fit(model, loaders()[0])
    assert seen["profiler"] is None
    assert seen["batch_start"] == model.on_train_batch_start and seen["step"] == model.training_step  # no wrapper


def test_only_local_rank_zero_logs_the_report(caplog):
    for rank, logged in ((1, False), (0, True), (None, True)):
        profiler = SimpleProfiler()
        profiler.setup("validate", local_rank=rank)
        with profiler.profile("action"):
            pass
        with caplog.at_level(logging.INFO, logger="framework"):
            caplog.clear()
            logging.getLogger("framework").propagate = True  # caplog listens at the root
            try:
                profiler.describe()
            finally:
                logging.getLogger("framework").propagate = False
        assert ("VALIDATE Profiler Report" in caplog.text) is logged, rank


@pytest.mark.parametrize(("value", "message"), [
    ("xla", "trainer.profiler='xla': use one of simple, advanced, pytorch"),
    (1, "trainer.profiler=1: use one of"),
    ({"_target_": "framework.callbacks.EarlyStopping", "monitor": "x"}, "trainer.profiler=.*EarlyStopping"),
])
def test_unknown_profilers_are_refused(value, message):
    with pytest.raises(ConfigError, match=message):
        fw.Trainer(profiler=value, **QUIET)


def test_a_profiler_with_barebones_is_refused_as_in_lightning():
    with pytest.raises(ConfigError, match="barebones"):
        fw.Trainer(profiler="simple", barebones=True, **QUIET)
    assert isinstance(fw.Trainer(profiler="Advanced", **QUIET).profiler, AdvancedProfiler)


def test_an_action_started_twice_or_never_is_an_error():
    profiler = SimpleProfiler()
    profiler.start("a")
    with pytest.raises(ValueError, match="already started"):
        profiler.start("a")
    with pytest.raises(ValueError, match="never started"):
        profiler.stop("b")
