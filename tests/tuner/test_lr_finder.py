"""``Tuner.lr_find`` (framework/tuner/lr_sweep.py, lr_finder.py) beside Lightning 2.6's: the same
module, data and seed give the same rates and smoothed losses, bit for bit, and the same suggestion;
afterwards the module's weights, the Trainer and the random streams are as before, so a fit
after it trains as one without it (at the suggested rate); the sweep's plot is a PNG."""

from __future__ import annotations

import importlib.util
import logging

import pytest
import torch

import framework as fw
from framework.errors import ConfigError
from framework.loggers import CSVLogger
from framework.trainer import checkpointing
from framework.tuner import LRFinder, Tuner
from tuner.models import make_hparams_regressor, make_regressor

needs_lightning = pytest.mark.skipif(importlib.util.find_spec("pytorch_lightning") is None,
                                     reason="pytorch_lightning is not installed (a test-only dependency: "
                                            "pip install -e '.[dev]')")
QUIET = dict(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
             enable_model_summary=False)

#: case -> (Trainer arguments, lr_find arguments, whether the module takes its data from a DataModule)
CASES = {
    "exponential": (dict(max_epochs=3), dict(), False),
    "linear, diverging": (dict(max_epochs=3), dict(mode="linear", max_lr=0.5, num_training=60), False),
    "accumulation, no early stop": (dict(max_epochs=4, accumulate_grad_batches=2),
                                    dict(num_training=40, early_stop_threshold=None, min_lr=1e-4), False),
    "hparams and a DataModule": (dict(max_epochs=2), dict(num_training=30, max_lr=3.0), True),
}


def _sweep(which: str, trainer_args: dict, find_args: dict, with_datamodule: bool, **model_args) -> dict:
    if which == "lightning":
        import pytorch_lightning as pl
        from pytorch_lightning.tuner import Tuner as TheTuner

        Module, Data, Trainer, extra = pl.LightningModule, pl.LightningDataModule, pl.Trainer, {}
    else:
        Module, Data, Trainer, TheTuner = fw.TrainModule, fw.DataModule, fw.Trainer, Tuner
        extra = dict(use_distributed_sampler=False)  # the loader's own shuffle, as Lightning's in one process
    from tuner.models import make_data

    torch.manual_seed(0)
    model = make_hparams_regressor(Module)(**model_args) if with_datamodule else make_regressor(Module)(**model_args)
    datamodule = make_data(Data)(batch_size=16) if with_datamodule else None
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = Trainer(**QUIET, **extra, **trainer_args)
    finder = TheTuner(trainer).lr_find(model, datamodule=datamodule, **find_args)
    lr = model.hparams.learning_rate if with_datamodule else model.lr
    return {"lr": finder.results["lr"], "loss": finder.results["loss"], "suggestion": finder.suggestion(),
            "set": lr, "restored": all(torch.equal(v, model.state_dict()[k]) for k, v in before.items()),
            "optimizers": [[g["lr"] for g in o.param_groups] for o in trainer.optimizers]}


@needs_lightning
@pytest.mark.timeout(90)
@pytest.mark.parametrize("case", CASES)
def test_lr_find_gives_lightnings_rates_losses_and_suggestion(case, tmp_path):
    theirs, ours = (_sweep(which, *CASES[case]) for which in ("lightning", "fw"))
    assert ours["lr"] == theirs["lr"]  # the schedule, bit for bit
    assert len(ours["loss"]) == len(theirs["loss"]) == len(ours["lr"])
    torch.testing.assert_close(torch.tensor(ours["loss"], dtype=torch.float64),  # the smoothed losses, bit for bit
                               torch.tensor(theirs["loss"], dtype=torch.float64), rtol=0, atol=0, equal_nan=True)
    assert ours["suggestion"] == theirs["suggestion"] is not None
    assert ours["set"] == theirs["set"] == ours["suggestion"]
    assert ours["restored"] and theirs["restored"]
    num_training = CASES[case][1].get("num_training", 100)
    if case == "linear, diverging":  # the early stop ran, and where Lightning's did
        assert len(ours["lr"]) < num_training
    if case == "accumulation, no early stop":  # every step that stepped, and only those
        assert len(ours["lr"]) == num_training


class _Counting(fw.Callback):
    """The user's callback: the Tuner's calls must not run it (Lightning's finder replaces it)."""

    def __init__(self):
        self.calls = 0

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.calls += 1


class _LoggerNoting(make_regressor(fw.TrainModule)):
    """Notes which logger each step sees (Lightning's finder: a DummyLogger, never the user's)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.loggers_seen: list[str] | None = []  # None: noting no more

    def training_step(self, batch, batch_idx):
        if self.loggers_seen is not None:
            self.loggers_seen.append(type(self.logger).__name__)
            self.logger.experiment.add_scalar("seen", 1.0)  # a no-op under the tuner, as on Lightning's DummyLogger
        return super().training_step(batch, batch_idx)


def _trainer(tmp_path, callback: fw.Callback) -> fw.Trainer:
    return fw.Trainer(accelerator="cpu", devices=1, max_epochs=2, default_root_dir=tmp_path / "root",
                      logger=CSVLogger(tmp_path / "logs"), callbacks=[callback], enable_progress_bar=False,
                      enable_model_summary=False, use_distributed_sampler=False)


@needs_lightning
@pytest.mark.timeout(90)
@pytest.mark.parametrize(("batch_size", "steps", "suggests"), [(16, 48, True), (128, 6, False)])
def test_a_sweep_the_data_cuts_short_gives_lightnings_suggestion_or_none_and_says_so(batch_size, steps, suggests,
                                                                                       caplog):
    """max_epochs=3 of 16 batches (or 2) run 48 (or 6) of the 100 steps: the same rates, losses and
    suggestion as Lightning's, set on the module as Lightning sets it; with too few points to
    suggest (6 - 10 skipped at the start), no suggestion and the rate left, as Lightning; either
    way fw warns that the sweep was cut short and how far it reached."""
    with caplog.at_level(logging.INFO):
        theirs = _sweep("lightning", dict(max_epochs=3), {}, False, batch_size=batch_size)
    with pytest.warns(UserWarning, match="lr_find: the training data ran out") as warned:
        ours = _sweep("fw", dict(max_epochs=3), {}, False, batch_size=batch_size)
    said = [str(w.message) for w in warned]

    assert len(ours["lr"]) == len(theirs["lr"]) == steps and ours["lr"] == theirs["lr"]
    torch.testing.assert_close(torch.tensor(ours["loss"], dtype=torch.float64),
                               torch.tensor(theirs["loss"], dtype=torch.float64), rtol=0, atol=0, equal_nan=True)
    assert ours["suggestion"] == theirs["suggestion"] and ours["set"] == theirs["set"]
    assert ours["restored"] and theirs["restored"]
    # fw's Trainer is as before (docs/lightning.md, Tuner); Lightning's keeps the optimizer of the fit its finder ran in
    assert ours["optimizers"] == [] and theirs["optimizers"] == [[theirs["set"]]]
    assert f"LR finder stopped early after {steps} steps" in caplog.text  # Lightning's line (info)
    assert any(f"lr_find: the training data ran out after {steps} of num_training=100 steps (max_epochs=3" in m
               and f"reached {ours['lr'][-1]:.3g} of max_lr=1" in m for m in said), said
    if suggests:
        assert ours["set"] == ours["suggestion"] == pytest.approx(1.0964781961431852e-07)
    else:
        assert ours["suggestion"] is None and ours["set"] == 0.01
        assert "Failed to compute suggestion for learning rate" in caplog.text  # Lightning's (an error line)
        assert any("no learning rate to suggest: 0 finite point(s)" in m for m in said), said


@pytest.mark.timeout(60)
def test_after_lr_find_everything_is_as_before_and_a_fit_trains_as_one_without_it(tmp_path):
    torch.manual_seed(0)
    model, counting = _LoggerNoting(), _Counting()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = _trainer(tmp_path, counting)
    callbacks, loggers, settings, rng = trainer.callbacks, trainer.loggers, trainer.settings, torch.get_rng_state()
    fits = checkpointing._fits_in_this_process  # what a restarted job's fits find their checkpoints by

    finder = Tuner(trainer).lr_find(model, num_training=30)

    assert isinstance(finder, LRFinder) and len(finder.results["lr"]) == 30
    assert model.lr == finder.suggestion() and model.lr != 0.01
    assert all(torch.equal(model.state_dict()[k], v) for k, v in weights.items())
    assert trainer.callbacks is callbacks and trainer.loggers is loggers and trainer.settings is settings
    assert trainer.global_step == 0 and trainer.current_epoch == 0 and not trainer.should_stop
    assert trainer.run is None and trainer.last_fit is None and trainer.batch_counts == {} and trainer.optimizers == [] and counting.calls == 0
    assert torch.equal(torch.get_rng_state(), rng) and checkpointing._fits_in_this_process == fits
    assert not list(tmp_path.rglob("*")), "the Tuner left files behind (checkpoints, log versions)"
    assert model.loggers_seen == ["_SilentLogger"] * 30
    model.loggers_seen = None  # the fits below: the plain step

    trainer.fit(model)
    torch.manual_seed(0)
    plain = make_regressor(fw.TrainModule)(lr=finder.suggestion())
    other = _trainer(tmp_path / "plain", _Counting())
    other.fit(plain)
    for key, value in plain.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key
    assert trainer.global_step == other.global_step == 64 and counting.calls == 64
    assert trainer.callback_metrics["val_loss"] == other.callback_metrics["val_loss"]
    # the fit used the first log version and its checkpoint the fit's own folder: none went to the Tuner
    assert [p.name for p in (tmp_path / "logs" / "fw_logs").iterdir()] == ["version_0"]
    assert len(list((tmp_path / "logs").rglob("*.ckpt"))) == 1


@pytest.mark.timeout(60)
def test_the_plot_of_the_sweep_is_a_png_with_the_suggestion_marked(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    torch.manual_seed(0)
    finder = Tuner(fw.Trainer(**QUIET, max_epochs=2)).lr_find(make_regressor(fw.TrainModule)(), num_training=40)
    fig = finder.plot(suggest=True)
    try:
        ax = fig.axes[0]
        curve, point = ax.lines
        assert list(curve.get_xdata()) == finder.results["lr"] and ax.get_xscale() == "log"
        assert list(point.get_xdata()) == [finder.suggestion()] and point.get_color() == "red"
        fig.savefig(tmp_path / "lr_find.png")
        assert (tmp_path / "lr_find.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        _, given = plt.subplots()
        assert finder.plot(ax=given) is given.figure and len(given.lines) == 1
    finally:
        plt.close("all")


@needs_lightning
def test_the_suggestion_is_lightnings_on_any_curve():
    from pytorch_lightning.tuner.lr_finder import _LRFinder

    g = torch.Generator().manual_seed(5)
    for trial in range(20):
        n = int(torch.randint(3, 60, (1,), generator=g))
        lrs = torch.logspace(-6, 0, n, dtype=torch.float64).tolist()
        losses = (torch.rand(n, generator=g, dtype=torch.float64) + torch.linspace(2, 0, n, dtype=torch.float64))
        losses[torch.rand(n, generator=g) < 0.1] = float("nan")
        ours, theirs = LRFinder("exponential", 1e-6, 1.0, n), _LRFinder("exponential", 1e-6, 1.0, n)
        ours.results = theirs.results = {"lr": lrs, "loss": losses.tolist()}
        for skip_begin, skip_end in ((10, 1), (0, 1), (3, 5), (n, 1)):
            assert ours.suggestion(skip_begin, skip_end) == theirs.suggestion(skip_begin, skip_end), trial
        # skip_end=0 leaves none out at the end (Lightning's slice [a:-0] is empty): one more point, skipped
        theirs.results = {"lr": [*lrs, 1.0], "loss": [*losses.tolist(), 0.0]}
        assert ours.suggestion(2, 0) == theirs.suggestion(2, 1), trial


def test_the_suggestion_needs_two_finite_points():
    finder = LRFinder("exponential", 1e-8, 1.0, 100)
    finder.results = {"lr": [1e-8 * 10 ** i for i in range(13)], "loss": [1.0] * 11 + [float("nan")] * 2}
    with pytest.warns(UserWarning, match="no learning rate to suggest: 1 finite point"):
        assert finder.suggestion() is None


class _TwoOptimizers(make_regressor(fw.TrainModule)):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        return None

    def configure_optimizers(self):
        return [torch.optim.SGD(self.net[0].parameters(), lr=self.lr), torch.optim.SGD(self.net[2].parameters())]


@pytest.mark.parametrize(("make", "args", "match"), [
    (lambda: fw.Trainer(**QUIET), dict(method="validate"), r"^lr_find: method='validate': .* runs 'fit' only"),
    (lambda: fw.Trainer(**QUIET), dict(dataloaders=[]), r"give train_dataloaders= and val_dataloaders="),
    (lambda: fw.Trainer(**QUIET), dict(mode="cubic"), r"^lr_find: mode='cubic': use one of linear, exponential"),
    (lambda: fw.Trainer(**QUIET), dict(attr_name="step_size"), r"has no attribute 'step_size'.*update_attr=False"),
    (lambda: fw.Trainer(**{**QUIET, "devices": 2}, strategy="ddp_gloo"), {}, r"'ddp_gloo' runs one process per device"),
])
def test_what_lr_find_refuses(make, args, match):
    with pytest.raises(ConfigError, match=match):
        Tuner(make()).lr_find(make_regressor(fw.TrainModule)(), **args)


def test_lr_find_refuses_several_optimizers_and_leaves_the_trainer_as_it_was():
    trainer = fw.Trainer(**QUIET, max_epochs=1)
    callbacks, settings = trainer.callbacks, trainer.settings
    with pytest.raises(ConfigError, match=r"returned 2 optimizers; the learning rate finder sweeps one"):
        Tuner(trainer).lr_find(_TwoOptimizers())
    assert trainer.callbacks is callbacks and trainer.settings is settings and trainer.global_step == 0


def test_lr_find_is_skipped_under_fast_dev_run(caplog):
    model = make_regressor(fw.TrainModule)()
    with pytest.warns(UserWarning, match="lr_find: skipped, as fast_dev_run is on"):
        assert Tuner(fw.Trainer(**QUIET, fast_dev_run=True)).lr_find(model) is None
    assert model.lr == 0.01


def test_the_module_without_a_learning_rate_is_tuned_with_update_attr_off():
    model = make_regressor(fw.TrainModule)()
    del model.lr
    model.configure_optimizers = lambda: torch.optim.SGD(model.parameters(), lr=0.01)
    with pytest.raises(ConfigError, match=r"has no attribute 'lr' or 'learning_rate'"):
        Tuner(fw.Trainer(**QUIET, max_epochs=1)).lr_find(model, num_training=5)
    with pytest.warns(UserWarning, match=r"lr_find: the training data ran out after 32 of num_training=50 steps"):
        finder = Tuner(fw.Trainer(**QUIET, max_epochs=1)).lr_find(model, num_training=50, update_attr=False)
    assert len(finder.results["lr"]) == 32 and not hasattr(model, "lr")  # one epoch of 32 batches
