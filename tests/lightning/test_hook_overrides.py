"""A hook a Lightning user overrides changes the run on fw as it does on Lightning: the same
seed, data and override end with the same parameters, bit for bit, and epoch-end hooks read
the epoch just finished (in one process; the hook sequence itself is in test_hook_calls.py)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import framework as fw
from framework.callbacks import Callback

pl = pytest.importorskip("pytorch_lightning")


def _data(n=40):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 6, generator=g)
    return TensorDataset(x, x @ torch.randn(6, 1, generator=g) + 0.1 * torch.randn(n, 1, generator=g))


# -- overrides, written once against Lightning's API -------------------------------------------
def warmup_optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure):
    """Lightning's documented LR warm-up."""
    if self.trainer.global_step < 5:
        for group in optimizer.param_groups:
            group["lr"] = min(1.0, float(self.trainer.global_step + 1) / 5) * 0.1
    optimizer.step(closure=optimizer_closure)


def every_other_step(self, epoch, batch_idx, optimizer, optimizer_closure):
    """Steps only on even batches (the closure always runs)."""
    if batch_idx % 2 == 0:
        optimizer.step(closure=optimizer_closure)
    else:
        optimizer_closure()


def zero_grad_keeping_half(self, epoch, batch_idx, optimizer):
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.grad is not None:
                p.grad.mul_(0.5)


def clip_first_layer_only(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
    self.clip_gradients(optimizer, gradient_clip_val=0.01, gradient_clip_algorithm="value")


def scaled_backward(self, loss, *args, **kwargs):
    (loss * 0.5).backward(*args, **kwargs)


def double_before_transfer(self, batch, dataloader_idx):
    return [batch[0] * 0.5, batch[1]]


def shift_after_transfer(self, batch, dataloader_idx):
    return [batch[0] + 0.1, batch[1]]


def transfer_reversed(self, batch, device, dataloader_idx):
    return [batch[0].flip(0).to(device), batch[1].flip(0).to(device)]


def halve_lr_by_hand(self, scheduler, metric):
    for group in scheduler.optimizer.param_groups:
        group["lr"] *= 0.5


def skip_rest_after_two(self, batch, batch_idx):
    return -1 if batch_idx == 2 else None


OVERRIDES = {
    "optimizer_step: warm-up": {"optimizer_step": warmup_optimizer_step},
    "optimizer_step: every other batch": {"optimizer_step": every_other_step},
    "optimizer_zero_grad": {"optimizer_zero_grad": zero_grad_keeping_half},
    "configure_gradient_clipping": {"configure_gradient_clipping": clip_first_layer_only},
    "backward": {"backward": scaled_backward},
    "batch transfer hooks": {"on_before_batch_transfer": double_before_transfer,
                             "on_after_batch_transfer": shift_after_transfer,
                             "transfer_batch_to_device": transfer_reversed},
    "lr_scheduler_step": {"lr_scheduler_step": halve_lr_by_hand},
    "on_train_batch_start returns -1": {"on_train_batch_start": skip_rest_after_two},
}


def make_model(Base, overrides: dict, interval="step", frequency=1, frozen=False):
    class Model(Base):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1))
            if frozen:  # a part the user keeps in eval mode: it must stay so through validation
                self.net[1].eval()

        def training_step(self, batch, batch_idx):
            loss = torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])
            self.log("loss", loss, on_epoch=True)
            return loss

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", torch.nn.functional.mse_loss(self.net(batch[0]), batch[1]))

        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
            sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": interval, "frequency": frequency}}

    for name, fn in overrides.items():
        setattr(Model, name, fn)
    return Model


def train(kind: str, overrides: dict, epochs=2, model_args=None, **trainer_args):
    Base, Trainer, seed = ((pl.LightningModule, pl.Trainer, pl.seed_everything) if kind == "lightning"
                           else (fw.TrainModule, fw.Trainer, fw.seed_everything))
    seed(3)
    model = make_model(Base, overrides, **(model_args or {}))()
    # use_distributed_sampler=False: the shuffled loader's own order, Lightning's in one process (fw's
    # default order is the one of any number of ranks: docs/lightning.md, "Where fw deliberately differs")
    trainer = Trainer(max_epochs=epochs, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                      use_distributed_sampler=False,
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                      **trainer_args)
    loader = DataLoader(_data(), batch_size=8, shuffle=True)
    trainer.fit(model, loader, DataLoader(_data(16), batch_size=8))
    return model, trainer


def assert_same_run(settings: dict, model_args=None, **trainer_args):
    (ours, t_ours), (theirs, t_theirs) = (train(k, settings, model_args=model_args, **trainer_args)
                                          for k in ("fw", "lightning"))
    for (name, a), b in zip(ours.state_dict().items(), theirs.state_dict().values(), strict=True):
        assert torch.equal(a, b), f"{name} differs from Lightning's by {(a - b).abs().max().item():.3g}"
    assert t_ours.global_step == t_theirs.global_step
    lr = [g["lr"] for g in t_ours.optimizers[0].param_groups]
    assert lr == [g["lr"] for g in t_theirs.optimizers[0].param_groups]
    return ours, theirs


@pytest.mark.parametrize("name", list(OVERRIDES))
def test_an_overridden_hook_gives_lightnings_parameters(name):
    assert_same_run(OVERRIDES[name])


def test_an_overridden_hook_under_accumulation_and_clipping_gives_lightnings_parameters():
    assert_same_run({"optimizer_step": warmup_optimizer_step, "optimizer_zero_grad": zero_grad_keeping_half},
                    accumulate_grad_batches=2, gradient_clip_val=0.5)


@pytest.mark.parametrize(("interval", "frequency"), [("step", 3), ("epoch", 2)])
def test_scheduler_frequency_counts_as_lightnings_does(interval, frequency):
    assert_same_run({}, model_args={"interval": interval, "frequency": frequency}, accumulate_grad_batches=2,
                    epochs=3)


def test_a_submodule_kept_in_eval_mode_stays_so_through_validation():
    ours, theirs = assert_same_run({}, model_args={"frozen": True}, val_check_interval=2)
    assert not ours.net[1].training and not theirs.net[1].training and ours.net[0].training


def test_epoch_end_hooks_read_the_epoch_just_finished():
    """Inside on_train_epoch_end and on_validation_epoch_end (module and callbacks), as in
    Lightning: callback_metrics holds this epoch's values, and the callbacks run first."""

    def seen_by(kind):
        seen: list = []
        CallbackBase = pl.Callback if kind == "lightning" else Callback

        class Reader(CallbackBase):
            def on_train_epoch_end(self, trainer, module):
                seen.append(("callback train", float(trainer.callback_metrics["loss_epoch"])))

            def on_validation_epoch_end(self, trainer, module):
                seen.append(("callback val", float(trainer.callback_metrics["val_loss"])))

        def module_train_end(self):
            seen.append(("module train", float(self.trainer.callback_metrics["loss_epoch"]),
                         float(self.trainer.callback_metrics["val_loss"])))
            self.log("from_hook", self.trainer.callback_metrics["loss_epoch"] * 2)

        def module_val_end(self):
            seen.append(("module val", float(self.trainer.callback_metrics["val_loss"])))

        _, trainer = train(kind, {"on_train_epoch_end": module_train_end, "on_validation_epoch_end": module_val_end},
                           callbacks=[Reader()])
        return seen, float(trainer.callback_metrics["from_hook"])

    ours, theirs = seen_by("fw"), seen_by("lightning")
    assert ours == theirs
    assert [kind for kind, *_ in ours[0][:4]] == ["callback val", "module val", "callback train", "module train"]


@pytest.mark.parametrize("args", [{"val_check_interval": 2}, {"val_check_interval": 0.5},
                                  {"val_check_interval": 3, "check_val_every_n_epoch": None},
                                  {"check_val_every_n_epoch": 2}])
def test_validation_runs_after_the_batches_lightning_validates_after(args):
    """5 batches an epoch: every 2 validates after the 2nd and 4th (not the 5th), and so on."""
    def validated_at(kind):
        steps: list = []
        def on_validation_start(self):
            steps.append(self.trainer.global_step)
        train(kind, {"on_validation_start": on_validation_start}, epochs=3, **args)
        return steps

    assert validated_at("fw") == validated_at("lightning")
    assert_same_run({}, epochs=3, **args)  # each validation draws a loader seed: the data order follows
