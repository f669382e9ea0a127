"""``Tuner.scale_batch_size`` (framework/tuner/batch_size.py) beside Lightning 2.6's: the same
module finds the same batch size in ``power`` and ``binsearch`` mode, trial for trial (the same
batches tried in the same order), with a module that runs out of memory above some batch size
(a CUDA out-of-memory error, as a GPU raises it) and without (on the CPU the search stops at
the data set's length or after ``max_trials``); afterwards the weights and the Trainer are as
before. Then where fw deliberately differs, and what it refuses."""

from __future__ import annotations

import importlib.util

import pytest
import torch

import framework as fw
from framework.errors import ConfigError, TrainingError
from framework.loggers import CSVLogger
from framework.tuner import Tuner
from tuner.models import make_data, make_regressor

QUIET = dict(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
             enable_model_summary=False, max_epochs=3)

#: case -> (module arguments, scale_batch_size arguments, with the batch size in a DataModule's hparams,
#: the size found, worked out by hand from the rules)
CASES = {
    "power, to the data set's length": (dict(), dict(), False, 256),  # 2, 4, ..., 256 >= the 256 samples
    "power, out of memory above 24": (dict(oom_above=24), dict(), False, 16),  # 32 ran out: half of it
    "power, max_trials": (dict(), dict(max_trials=3, init_val=3), False, 12),  # 3, 6, 12: three trials
    # 128 covers the 100 samples; less 5%
    "binsearch, to the data set's length": (dict(n=100), dict(mode="binsearch"), False, 121),
    # 32 fails, 24 fits, 28, 26, 25 fail: 24, less 5%
    "binsearch, out of memory above 24": (dict(oom_above=24), dict(mode="binsearch"), False, 22),
    # 3 .. 24 fit, 48 fails, 36 fits, 42 fails, 39, 40, 41 fit: 41, less 10%
    "binsearch, DataModule hparams": (dict(oom_above=41), dict(mode="binsearch", init_val=3, margin=0.1), True, 36),
    # validation batches: 32 and 24 fail, 20 fits, 22 and 21 fail: 20, less 5%
    "binsearch, validate": (dict(oom_above=20), dict(mode="binsearch", method="validate", steps_per_trial=2), False,
                            19),
    "first size covers the data set": (dict(batch_size=300), dict(), False, 300),  # no trial can grow it
}


def _search(which: str, module_args: dict, search_args: dict, with_datamodule: bool) -> dict:
    if which == "lightning":
        import pytorch_lightning as pl
        from pytorch_lightning.tuner import Tuner as TheTuner

        Module, Data, Trainer = pl.LightningModule, pl.LightningDataModule, pl.Trainer
    else:
        Module, Data, Trainer, TheTuner = fw.TrainModule, fw.DataModule, fw.Trainer, Tuner
    torch.manual_seed(0)
    model = make_regressor(Module)(**module_args)
    datamodule = make_data(Data)(n=module_args.get("n", 200)) if with_datamodule else None
    if datamodule is not None:
        del model.batch_size  # the batch size is the DataModule's only
    holder = datamodule.hparams if datamodule is not None else model.__dict__
    first = holder["batch_size"]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    found = TheTuner(Trainer(**QUIET)).scale_batch_size(model, datamodule=datamodule, **search_args)
    return {"found": found, "set": holder["batch_size"], "first": first,
            "tried": model.sizes, "validated": model.val_sizes,
            "restored": all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())}


def _after_the_first_trial(sizes: list[int], first: int) -> list[int]:
    n = next((i for i, size in enumerate(sizes) if size != first), len(sizes))
    return sizes[n:]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("case", CASES)
def test_scale_batch_size_finds_lightnings_size_trial_for_trial(case, monkeypatch):
    *args, expected = CASES[case]
    ours = _search("fw", *args)
    assert ours["found"] == ours["set"] == expected and ours["restored"]
    if importlib.util.find_spec("pytorch_lightning") is None:
        pytest.skip("fw's size is the one worked out; pytorch_lightning is not installed to compare (pip install "
                    "-e '.[dev]')")
    from pytorch_lightning.tuner import batch_size_scaling

    # Lightning collects garbage before every trial (a fraction of a second each in a test process): its trials
    # are the same without, and the test an order of magnitude faster
    monkeypatch.setattr(batch_size_scaling, "garbage_collection_cuda", lambda: None)
    theirs = _search("lightning", *args)
    assert theirs["found"] == theirs["set"] == expected and theirs["restored"]
    # Then each training and validation batch of each trial, in order. Lightning's first fit trial runs the loader
    # it built before it set init_val, at the batch size the module had; fw's runs init_val, as the search assumes.
    if args[1].get("method", "fit") == "fit":
        ours_first = args[1].get("init_val", 2) if expected != ours["first"] else ours["first"]
        for key in ("tried", "validated"):
            ours[key], theirs[key] = (_after_the_first_trial(ours[key], ours_first),
                                      _after_the_first_trial(theirs[key], theirs["first"]))
    assert ours["tried"] == theirs["tried"] and ours["validated"] == theirs["validated"]
    assert ours["tried"] or ours["validated"]


def test_after_scale_batch_size_the_module_and_trainer_are_as_before(tmp_path):
    torch.manual_seed(0)
    model = make_regressor(fw.TrainModule)(oom_above=24)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = fw.Trainer(accelerator="cpu", devices=1, max_epochs=1, default_root_dir=tmp_path / "root",
                         logger=CSVLogger(tmp_path / "logs"), enable_progress_bar=False, enable_model_summary=False)
    callbacks, loggers, settings, rng = trainer.callbacks, trainer.loggers, trainer.settings, torch.get_rng_state()
    assert Tuner(trainer).scale_batch_size(model, mode="binsearch") == model.batch_size == 22
    assert all(torch.equal(model.state_dict()[k], v) for k, v in weights.items())
    assert trainer.callbacks is callbacks and trainer.loggers is loggers and trainer.settings is settings
    assert trainer.global_step == 0 and trainer.run is None and torch.equal(torch.get_rng_state(), rng)
    assert trainer.last_fit is None and trainer.batch_counts == {} and trainer.optimizers == [] and trainer.num_val_batches == []
    assert not list(tmp_path.rglob("*")), "the Tuner left files behind (checkpoints, log versions)"
    trainer.fit(model)
    assert trainer.global_step == 12  # 256 samples in batches of 22
    assert [p.name for p in (tmp_path / "logs" / "fw_logs").iterdir()] == ["version_0"]
    assert len(list(tmp_path.rglob("*.ckpt"))) == 1


def test_a_size_that_ran_out_of_memory_is_never_the_answer():
    """Deliberately unlike Lightning 2.6: a trial of 128 on 100 samples (one batch of all 100)
    that runs out of memory. Lightning keeps 128, as it is not below the data set's length, and
    returns it in power mode (in binsearch mode it tries it again without end); fw goes down."""
    model = make_regressor(fw.TrainModule)(n=100, oom_above=80)
    assert Tuner(fw.Trainer(**QUIET)).scale_batch_size(model) == 64
    model = make_regressor(fw.TrainModule)(n=100, oom_above=80)
    assert Tuner(fw.Trainer(**QUIET)).scale_batch_size(model, mode="binsearch", margin=0.0) == 80
    assert model.sizes[-7:] == [80, 20, 80, 88, 84, 82, 81]  # 80 fitted (100 samples: 80, 20, 80), the rest failed


def test_max_val_caps_power_mode_and_is_tried():
    """Deliberately unlike Lightning 2.6, whose power mode returns 32 here (twice 16, never tried)."""
    model = make_regressor(fw.TrainModule)()
    assert Tuner(fw.Trainer(**QUIET)).scale_batch_size(model, max_val=20) == model.batch_size == 20
    assert 20 in model.sizes


def test_out_of_memory_at_batch_size_one_is_an_error():
    model = make_regressor(fw.TrainModule)(oom_above=0)
    with pytest.raises(TrainingError, match=r"^scale_batch_size: batch size 1 runs out of memory and there is no "):
        Tuner(fw.Trainer(**QUIET)).scale_batch_size(model)
    assert model.sizes == [2, 1]


def test_another_error_in_a_trial_ends_the_search_with_everything_put_back():
    class Failing(make_regressor(fw.TrainModule)):
        def training_step(self, batch, batch_idx):
            if len(batch[0]) > 4:
                raise ValueError("a bug in the step")
            return super().training_step(batch, batch_idx)

    torch.manual_seed(0)
    model, trainer = Failing(), fw.Trainer(**QUIET)
    weights, settings = {k: v.clone() for k, v in model.state_dict().items()}, trainer.settings
    with pytest.raises(ValueError, match="a bug in the step"):
        Tuner(trainer).scale_batch_size(model)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in weights.items())
    assert trainer.settings is settings and trainer.global_step == 0
    assert model.batch_size == 8  # the trial's size


@pytest.mark.parametrize(("make", "args", "match"), [
    (lambda: fw.Trainer(**QUIET), dict(train_dataloaders=[]),
     r"^scale_batch_size: train_dataloaders= was given, whose batch size the search cannot change"),
    (lambda: fw.Trainer(**QUIET), dict(method="test", dataloaders=[]), r"^scale_batch_size: dataloaders= was given"),
    (lambda: fw.Trainer(**QUIET), dict(batch_arg_name="bs"), r"batch_arg_name='bs' is not an attribute of Regressor"),
    (lambda: fw.Trainer(**QUIET), dict(mode="powers"), r"mode='powers': use one of power, binsearch \(did you mean"),
    (lambda: fw.Trainer(**QUIET), dict(margin=1.0), r"margin=1.0: use a fraction with 0 <= margin < 1"),
    (lambda: fw.Trainer(**QUIET), dict(method="train"), r"method='train': use one of fit, validate, test, predict"),
    (lambda: fw.Trainer(**QUIET), dict(max_trials=0), r"max_trials=0: must be an integer >= 1"),
    (lambda: fw.Trainer(**{**QUIET, "devices": 2}, strategy="ddp_gloo"), {}, r"runs one process per device"),
])
def test_what_scale_batch_size_refuses(make, args, match):
    with pytest.raises(ConfigError, match=match):
        Tuner(make()).scale_batch_size(make_regressor(fw.TrainModule)(), **args)


def test_scale_batch_size_is_skipped_under_fast_dev_run():
    model = make_regressor(fw.TrainModule)()
    with pytest.warns(UserWarning, match="scale_batch_size: skipped, as fast_dev_run is on"):
        assert Tuner(fw.Trainer(**{**QUIET, "fast_dev_run": True})).scale_batch_size(model) is None
    assert model.batch_size == 8 and model.sizes == []
