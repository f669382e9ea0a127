"""Manual optimization (``self.automatic_optimization = False``) with Lightning's meaning: the
module's own backward and steps run, nothing of the automatic loop runs besides them, and the
numbers equal Lightning's (when pytorch_lightning is installed) and, under 2 Gloo ranks on half
batches, one process on the full batch."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, subprocess_env
from forked import run_script
from mpi_helpers import mpiexec, needs_mpi

from framework.errors import ConfigError

needs_lightning = pytest.mark.skipif(importlib.util.find_spec("pytorch_lightning") is None,
                                     reason="pytorch_lightning is not installed (pip install pytorch-lightning; "
                                            "a test-only dependency)")

RUN = """
import sys, torch
sys.path.insert(0, {tests!r})
from lightning.modules import gan_loader, make_accumulating, make_gan

which, model_name, out = sys.argv[1], sys.argv[2], sys.argv[3]
common = dict(max_epochs=2, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
              enable_progress_bar=False, num_sanity_val_steps=0)
if which == "lightning":
    import pytorch_lightning as pl
    pl.seed_everything(0)
    Base, trainer = pl.LightningModule, pl.Trainer(enable_model_summary=False, **common)
else:
    import framework as fw
    fw.seed_everything(0)
    Base, trainer = fw.TrainModule, fw.Trainer(**common)
model = (make_gan if model_name == "gan" else make_accumulating)(Base)()
trainer.fit(model, gan_loader(8))
torch.save({{"state": model.state_dict(), "step": trainer.global_step,
            "metrics": {{k: float(v) for k, v in trainer.callback_metrics.items()}}}}, out)
"""


def _run(tmp_path, which: str, model: str) -> dict:
    script = tmp_path / "run.py"
    script.write_text(RUN.format(tests=str(ROOT / "tests")))
    out = tmp_path / f"{which}_{model}.pt"
    done = run_script(script, which, model, str(out), env=subprocess_env(), cwd=tmp_path)  # forked from this process
    assert done.returncode == 0, done.output
    return torch.load(out)


@needs_lightning
@pytest.mark.timeout(60)
@pytest.mark.parametrize("model", ["gan", "accumulating"])
def test_manual_optimization_gives_lightnings_parameters_bit_for_bit(tmp_path, model):
    ours, theirs = _run(tmp_path, "fw", model), _run(tmp_path, "lightning", model)
    assert ours["step"] == theirs["step"]  # every opt.step() counts, as in Lightning
    assert ours["state"].keys() == theirs["state"].keys()
    for key, value in theirs["state"].items():
        assert torch.equal(ours["state"][key], value), key
    assert ours["metrics"] == theirs["metrics"]


def test_manual_optimization_steps_and_backward_only_what_the_module_asks():
    """The returned loss is not backpropagated, nothing is stepped twice, schedulers step only
    when the module steps them, and global_step counts each optimizer step."""
    import framework as fw
    from lightning.modules import gan_loader, make_gan

    GAN = make_gan(fw.TrainModule)
    fw.seed_everything(0)
    model = GAN()
    steps = []

    class Count(fw.Callback):
        def on_before_optimizer_step(self, trainer, module, optimizer):
            steps.append(optimizer)

    trainer = fw.Trainer(max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         callbacks=[Count()])
    trainer.fit(model, gan_loader(8))
    assert trainer.global_step == len(steps) == 2 * 8 * 2  # 2 optimizers x 8 batches x 2 epochs
    opt_g, opt_d = model.optimizers()
    assert steps[:2] == [opt_g.optimizer, opt_d.optimizer]
    assert opt_g.param_groups[0]["lr"] == pytest.approx(0.01 * 0.5 ** 2)  # two epoch-end steps, by the module
    assert all(p.requires_grad for p in model.parameters())  # untoggled


@pytest.mark.parametrize("setting", [{"accumulate_grad_batches": 2}, {"gradient_clip_val": 1.0}])
def test_automatic_only_settings_are_refused_with_manual_optimization(setting):
    import framework as fw
    from lightning.modules import gan_loader, make_gan

    trainer = fw.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False, **setting)
    with pytest.raises(ConfigError, match=next(iter(setting))):
        trainer.fit(make_gan(fw.TrainModule)(), gan_loader(8))


DDP = """
import sys, torch
import framework as fw
sys.path.insert(0, {tests!r})
from lightning.modules import gan_loader, make_accumulating, make_gan

model_name, strategy, devices, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
fw.seed_everything(0)
model = (make_gan if model_name == "gan" else make_accumulating)(fw.TrainModule)()
trainer = fw.Trainer(max_epochs=2, accelerator="cpu", devices=devices, strategy=strategy, logger=False,
                     enable_checkpointing=False, enable_progress_bar=False, num_sanity_val_steps=0,
                     enable_model_summary=False)
trainer.fit(model, gan_loader(8 // trainer.world_size))
if trainer.is_global_zero:
    torch.save({{"state": model.state_dict(), "step": trainer.global_step}}, out)
"""


def _run_ddp(tmp_path, model: str, strategy: str, devices: int, mpiexec: str | None = None) -> dict:
    """One process or 2 ranks forked from this one (tests/forked.py), or 2 ranks under ``mpiexec``."""
    script = tmp_path / "ddp.py"
    script.write_text(DDP.format(tests=str(ROOT / "tests")))
    out = tmp_path / f"{model}-{strategy}-{devices}.pt"
    args = [model, strategy, str(devices), str(out)]
    if mpiexec is None:
        done = run_script(script, *args, nprocs=devices, env=subprocess_env(), cwd=tmp_path)
        assert done.returncode == 0, done.output
    else:
        proc = subprocess.run([mpiexec, "-n", str(devices), sys.executable, str(script), *args], env=subprocess_env(),
                              capture_output=True, text=True, timeout=150, cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return torch.load(out)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("model", "steps"), [("gan", 32), ("accumulating", 8)])
def test_manual_optimization_on_two_gloo_ranks_equals_one_process_on_the_full_batch(tmp_path, model, steps):
    """A GAN (two optimizers, toggled, clipped) and manual accumulation (a backward every
    batch, a step every second): 2 ranks on half batches = one process on the full batch."""
    one, two = _run_ddp(tmp_path, model, "single", 1), _run_ddp(tmp_path, model, "ddp_gloo", 2)
    assert one["step"] == two["step"] == steps
    for key, value in one["state"].items():
        torch.testing.assert_close(two["state"][key], value, atol=1e-5, rtol=0, msg=key)


@needs_mpi
@pytest.mark.timeout(60)
def test_manual_gan_under_mpi_equals_one_process_on_the_full_batch(tmp_path):
    one = _run_ddp(tmp_path, "gan", "single", 1)
    two = _run_ddp(tmp_path, "gan", "mpi", 2, mpiexec=mpiexec())
    for key, value in one["state"].items():
        torch.testing.assert_close(two["state"][key], value, atol=1e-5, rtol=0, msg=key)


def test_manual_optimization_under_16_mixed_equals_the_hand_written_amp_loop():
    """manual_backward scales the loss, clip_gradients unscales first, step goes through the
    GradScaler and updates it: the same numbers as torch.amp written by hand."""
    import torch.nn.functional as F

    import framework as fw
    from lightning.modules import gan_loader, make_accumulating

    class Clipped(make_accumulating(fw.TrainModule, every=1)):
        def training_step(self, batch, batch_idx):
            x, z = batch
            opt = self.optimizers()
            loss = F.mse_loss(self.net(x), z[:, :1])
            self.manual_backward(loss)
            self.clip_gradients(opt, gradient_clip_val=0.1)
            opt.step()
            opt.zero_grad()

    fw.seed_everything(0)
    model = Clipped()
    init = {k: v.clone() for k, v in model.state_dict().items()}
    fw.Trainer(max_epochs=1, precision="16-mixed", logger=False, enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False).fit(model, gan_loader(8))

    fw.seed_everything(0)
    by_hand = Clipped()
    by_hand.load_state_dict(init)
    opt = torch.optim.SGD(by_hand.net.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu")
    for x, z in gan_loader(8):
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.mse_loss(by_hand.net(x), z[:, :1])
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(by_hand.net.parameters(), 0.1)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    for key, value in by_hand.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key
