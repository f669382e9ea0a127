"""Every hook of Lightning 2.6's LightningModule and Callback is called by fw where Lightning
calls it, or refused at the start of the run; the call sequences of fit (with and without
validation, with accumulation and clipping, manual optimisation, resumed, failing), validate,
test and predict equal Lightning's, recorded the way Lightning's own ``test_hooks.py`` records
them: every hook overridden to note its name and call the default.

The differences docs/lightning.md names are taken out before comparing, each
checked on its own: fw asks for a stage's loaders once at set-up (after ``configure_model``,
before ``configure_optimizers``), and restores a checkpoint after ``configure_optimizers``.
"""

from __future__ import annotations

import inspect

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import framework as fw
from framework.callbacks import Callback
from framework.errors import ConfigError

pl = pytest.importorskip("pytorch_lightning")

#: LightningModule methods a user calls (or that build the module), rather than hooks Lightning calls
USER_CALLED = {
    "all_gather", "forward", "freeze", "unfreeze", "log", "log_dict", "lr_schedulers", "optimizers", "print",
    "save_hyperparameters", "load_from_checkpoint", "toggle_optimizer", "untoggle_optimizer", "toggled_optimizer",
    "to_onnx", "to_torchscript", "to_tensorrt", "remove_ignored_hparams",
}
#: overridable names fw refuses at the start of a run (with what to do instead)
REFUSED = {"configure_sharded_model"}
LOADERS = {"train_dataloader", "val_dataloader", "test_dataloader", "predict_dataloader"}


def lightning_module_hooks() -> list[str]:
    """Public methods of LightningModule's own classes (not nn.Module's), minus the user API."""
    names = set()
    for cls in pl.LightningModule.__mro__:
        if cls.__module__.startswith("pytorch_lightning"):
            names |= {n for n, v in vars(cls).items() if not n.startswith("_") and inspect.isfunction(v)}
    return sorted(names - USER_CALLED)


def lightning_callback_hooks() -> list[str]:
    return sorted(n for n, v in vars(pl.Callback).items() if not n.startswith("_") and inspect.isfunction(v))


def _data():
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)), batch_size=4)


def recording(Base, CallbackBase, calls: list, manual: bool = False, fail_at: int | None = None):  # noqa: C901 (a method per hook)
    """A module and a callback of ``Base``/``CallbackBase`` that record every hook call."""

    class Model(Base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)
            self.automatic_optimization = not manual

        def forward(self, x):
            return self.layer(x)

        def training_step(self, batch, batch_idx):
            if batch_idx == fail_at:
                raise RuntimeError("failing on purpose")
            loss = (self(batch[0]) - batch[1]).pow(2).mean()
            self.log("train_loss", loss)
            if manual:
                opt = self.optimizers()
                opt.zero_grad()
                self.manual_backward(loss)
                opt.step()
            return loss

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", (self(batch[0]) - batch[1]).pow(2).mean())

        def test_step(self, batch, batch_idx):
            self.log("test_loss", (self(batch[0]) - batch[1]).pow(2).mean())

        def predict_step(self, batch, batch_idx):
            return self(batch[0])

        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=0.1)
            return [opt], [torch.optim.lr_scheduler.StepLR(opt, 1)]

        def train_dataloader(self):
            return _data()

        val_dataloader = test_dataloader = predict_dataloader = train_dataloader

    def note(name, default):
        def hook(self, *args, **kwargs):
            calls.append(name)
            return default(self, *args, **kwargs)
        return hook

    for name in lightning_module_hooks():
        default = vars(Model).get(name) or getattr(Base, name, None)
        if default is not None and name not in REFUSED:
            setattr(Model, name, note(name, default))

    class Recorder(CallbackBase):
        def state_dict(self):
            return {"recorded": True}  # a state to save and load back

    for name in lightning_callback_hooks():
        setattr(Recorder, name, note(f"Callback.{name}", getattr(Recorder, name)))
    return Model, Recorder


def run(kind: str, which: str, manual=False, fail_at=None, resume=None, **trainer_args) -> list[str]:
    calls: list[str] = []
    if kind == "lightning":
        Base, CallbackBase, Trainer = pl.LightningModule, pl.Callback, pl.Trainer
    else:
        Base, CallbackBase, Trainer = fw.TrainModule, Callback, fw.Trainer
    Model, Recorder = recording(Base, CallbackBase, calls, manual, fail_at)
    settings = dict(max_epochs=1, callbacks=[Recorder()], enable_progress_bar=False, accelerator="cpu", devices=1,
                    num_sanity_val_steps=1, enable_model_summary=False, logger=False, enable_checkpointing=False)
    trainer = Trainer(**{**settings, **trainer_args})
    model = Model()
    if resume is not None:
        path = resume(kind, Trainer, Model, Recorder)
        del calls[:]  # what making the checkpoint called
        getattr(trainer, which)(model, ckpt_path=path)
    elif fail_at is not None:
        with pytest.raises(RuntimeError, match="failing on purpose"):
            getattr(trainer, which)(model)
    else:
        getattr(trainer, which)(model)
    return calls


def checkpoint_of(tmp_path):
    def make(kind, Trainer, Model, Recorder):
        trainer = Trainer(max_epochs=1, callbacks=[Recorder()], enable_progress_bar=False, accelerator="cpu",
                          devices=1, logger=False, enable_checkpointing=False, enable_model_summary=False)
        trainer.fit(Model())
        path = str(tmp_path / f"{kind}.ckpt")
        trainer.save_checkpoint(path)
        return path
    return make


SCENARIOS = {
    "fit": ("fit", {}),
    "fit, accumulation and clipping": ("fit", {"accumulate_grad_batches": 2, "gradient_clip_val": 0.5}),
    "fit, manual optimisation": ("fit", {"manual": True}),
    "fit without validation": ("fit", {"limit_val_batches": 0}),
    "fit without training batches": ("fit", {"limit_train_batches": 0}),
    "fit that fails": ("fit", {"fail_at": 1}),
    "validate": ("validate", {}),
    "test": ("test", {}),
    "predict": ("predict", {}),
}


def _without_loader_requests(calls: list[str]) -> list[str]:
    return [c for c in calls if c not in LOADERS]


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_hook_calls_equal_lightnings(scenario):
    which, args = SCENARIOS[scenario]
    lightning, ours = run("lightning", which, **args), run("fw", which, **args)
    assert _without_loader_requests(ours) == _without_loader_requests(lightning)
    # the named difference: every loader of the stage at set-up, once, after configure_model (the
    # training loader too where limit_train_batches=0 leaves it unread: Lightning never asks for it)
    unread = ["train_dataloader"] if args.get("limit_train_batches") == 0 else []
    assert sorted(c for c in ours if c in LOADERS) == sorted([c for c in lightning if c in LOADERS] + unread)
    asked = [i for i, c in enumerate(ours) if c in LOADERS]
    assert all(ours.index("configure_model") < i for i in asked)
    if "configure_optimizers" in ours:
        assert all(i < ours.index("configure_optimizers") for i in asked)


def test_a_resumed_fit_calls_lightnings_hooks(tmp_path):
    lightning = run("lightning", "fit", resume=checkpoint_of(tmp_path), max_epochs=2)
    ours = run("fw", "fit", resume=checkpoint_of(tmp_path), max_epochs=2)
    # the named difference: fw restores after configure_optimizers (Lightning: the module and the
    # callbacks before it, the optimizers after on_fit_start)
    restore = ["on_load_checkpoint", "Callback.on_load_checkpoint", "Callback.load_state_dict"]
    assert [c for c in ours if c in restore] == [c for c in lightning if c in restore]
    assert ours.index("configure_optimizers") < ours.index("on_load_checkpoint") < ours.index("on_fit_start")
    assert [c for c in _without_loader_requests(ours) if c not in restore] == \
        [c for c in _without_loader_requests(lightning) if c not in restore]


def test_checkpoint_hooks_are_called_in_lightnings_order(tmp_path):
    orders = {}
    for kind, Base, CallbackBase, Trainer in [("lightning", pl.LightningModule, pl.Callback, pl.Trainer),
                                               ("fw", fw.TrainModule, Callback, fw.Trainer)]:
        calls: list[str] = []
        Model, Recorder = recording(Base, CallbackBase, calls)
        trainer = Trainer(max_epochs=1, callbacks=[Recorder()], enable_progress_bar=False, accelerator="cpu",
                          devices=1, logger=False, enable_checkpointing=False, enable_model_summary=False)
        trainer.fit(Model())
        del calls[:]
        trainer.save_checkpoint(str(tmp_path / f"{kind}.ckpt"))
        orders[kind] = calls
    assert orders["fw"] == orders["lightning"] == ["Callback.state_dict", "Callback.on_save_checkpoint",
                                                   "on_save_checkpoint"]


def test_every_lightning_hook_is_called_or_refused(tmp_path):
    """Each overridable name of LightningModule and Callback: fw calls an override of it in one
    of the scenarios above, or refuses it at the start of the run, naming it."""
    called: set[str] = set()
    for which, args in SCENARIOS.values():
        called |= set(run("fw", which, **args))
    called |= set(run("fw", "fit", resume=checkpoint_of(tmp_path), max_epochs=2))
    calls: list[str] = []
    Model, Recorder = recording(fw.TrainModule, Callback, calls)
    trainer = fw.Trainer(max_epochs=1, callbacks=[Recorder()], enable_progress_bar=False, logger=False,
                         enable_checkpointing=False, enable_model_summary=False)
    trainer.fit(Model())
    trainer.save_checkpoint(str(tmp_path / "x.ckpt"))
    called |= set(calls)

    missing = [n for n in lightning_module_hooks() if n not in called and n not in REFUSED]
    missing += [f"Callback.{n}" for n in lightning_callback_hooks() if f"Callback.{n}" not in called]
    assert missing == []
    for name in REFUSED:
        Refusing = type("Refusing", (Model,), {name: lambda self: None})
        with pytest.raises(ConfigError, match=name):
            fw.Trainer(max_epochs=1, enable_progress_bar=False, logger=False, enable_checkpointing=False,
                       enable_model_summary=False).fit(Refusing())
