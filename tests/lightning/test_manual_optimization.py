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
    proc = subprocess.run([sys.executable, str(script), which, model, str(out)], env=subprocess_env(),
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return torch.load(out)


@needs_lightning
@pytest.mark.timeout(240)
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
from lightning.modules import gan_loader, make_gan

devices, out = int(sys.argv[1]), sys.argv[2]
fw.seed_everything(0)
model = make_gan(fw.TrainModule)()
trainer = fw.Trainer(max_epochs=2, accelerator="cpu", devices=devices, strategy="ddp_gloo" if devices > 1 else "single",
                     logger=False, enable_checkpointing=False, enable_progress_bar=False, num_sanity_val_steps=0)
trainer.fit(model, gan_loader(8 // devices))
if trainer.is_global_zero:
    torch.save({{"state": model.state_dict(), "step": trainer.global_step}}, out)
"""


@pytest.mark.timeout(180)
def test_manual_gan_on_two_gloo_ranks_equals_one_process_on_the_full_batch(tmp_path):
    script = tmp_path / "ddp.py"
    script.write_text(DDP.format(tests=str(ROOT / "tests")))
    results = {}
    for devices in (1, 2):
        out = tmp_path / f"d{devices}.pt"
        proc = subprocess.run([sys.executable, str(script), str(devices), str(out)], env=subprocess_env(),
                              capture_output=True, text=True, timeout=150, cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        results[devices] = torch.load(out)
    assert results[1]["step"] == results[2]["step"] == 32
    for key, value in results[1]["state"].items():
        torch.testing.assert_close(results[2]["state"][key], value, atol=1e-5, rtol=0, msg=key)
