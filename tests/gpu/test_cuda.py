"""CUDA, NCCL and DataParallel. These need GPUs: without one they skip with the reason; on the
GPU machine they run (results recorded in benchmarks/results/gpu-tests-*.txt)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import ROOT, subprocess_env
from toy import LinearModel, loader, regression_data

import framework as fw
from framework.errors import ConfigError

pytestmark = pytest.mark.gpu
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
needs_gpu = pytest.mark.skipif(GPUS < 1, reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
needs_2_gpus = pytest.mark.skipif(GPUS < 2, reason=f"needs 2 CUDA GPUs, this machine has {GPUS}")
QUIET = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False)


def _fit(strategy, devices, batch, precision="32", accelerator="cuda", epochs=2, pin=False):
    model = LinearModel(lr=0.05)
    trainer = fw.Trainer(accelerator=accelerator, devices=devices, strategy=strategy, max_epochs=epochs,
                         precision=precision, num_sanity_val_steps=0, **QUIET)
    dl = torch.utils.data.DataLoader(regression_data(64), batch_size=batch, pin_memory=pin)
    trainer.fit(model, dl)
    return model, trainer


def _cpu_reference(batch):
    model = LinearModel(lr=0.05)
    fw.Trainer(accelerator="cpu", devices=1, max_epochs=2, num_sanity_val_steps=0, **QUIET).fit(
        model, loader(regression_data(64), batch))
    return model


def _assert_close_to(model, reference, atol=1e-5):
    for (name, p), q in zip(model.state_dict().items(), reference.state_dict().values(), strict=True):
        diff = (p.detach().cpu() - q.cpu()).abs().max().item()
        print(f"{name}: max abs diff {diff:.3g}")
        assert diff <= atol, f"{name}: max abs diff {diff:.3g} > {atol}"


@needs_gpu
def test_single_gpu_trains_on_cuda_with_pinned_non_blocking_batches():
    seen = []

    class Probe(fw.Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            seen.append(batch[0].device)

    model = LinearModel(lr=0.05)
    trainer = fw.Trainer(accelerator="cuda", devices=1, max_epochs=2, callbacks=[Probe()],
                         logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.fit(model, torch.utils.data.DataLoader(regression_data(64), batch_size=8, pin_memory=True))
    assert trainer.strategy.name == "single" and trainer.strategy.root_device.type == "cuda"
    assert all(d.type == "cuda" for d in seen) and next(model.parameters()).is_cuda
    _assert_close_to(model, _cpu_reference(8), atol=1e-4)  # same arithmetic as the CPU, up to kernels


@needs_gpu
@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_mixed_precision_on_cuda(precision):
    model, trainer = _fit("single", 1, 8, precision=precision)
    assert (trainer.scaler is not None) == (precision == "16-mixed")
    assert all(torch.isfinite(p).all() for p in model.parameters())
    _assert_close_to(model, _cpu_reference(8), atol=5e-2)


@needs_gpu
def test_ddp_nccl_world_of_one_matches_single_device():
    model, trainer = _fit({"name": "ddp_nccl"}, 1, 8)
    assert trainer.strategy.backend == "nccl"
    single, _ = _fit("single", 1, 8)
    _assert_close_to(model, single, atol=1e-5)


@needs_gpu
def test_dp_on_the_visible_gpus_matches_one_device_on_the_full_batch():
    wrappers = []

    class Wrapper(fw.Callback):
        def on_train_start(self, trainer, module):
            wrappers.append(trainer.model)  # the wrapper that runs the steps

    model = LinearModel(lr=0.05)
    fw.Trainer(accelerator="cuda", devices=GPUS, strategy="dp", max_epochs=2, num_sanity_val_steps=0,
               callbacks=[Wrapper()], logger=False, enable_checkpointing=False, enable_progress_bar=False).fit(
        model, loader(regression_data(64), 8))
    assert isinstance(wrappers[0], torch.nn.DataParallel)
    single, _ = _fit("single", 1, 8)
    _assert_close_to(model, single, atol=1e-5)


@needs_gpu
def test_more_devices_than_gpus_is_a_config_error():
    with pytest.raises(ConfigError, match=f"this machine has {GPUS} GPU"):
        fw.Trainer(accelerator="cuda", devices=GPUS + 1, strategy="ddp_nccl")


@needs_gpu
def test_ddp_auto_picks_nccl_on_cuda():
    trainer = fw.Trainer(accelerator="cuda", devices=1, strategy="ddp", **QUIET)
    assert trainer.strategy.backend == "nccl"


@needs_2_gpus
@pytest.mark.timeout(180)
def test_ddp_nccl_two_gpus_equal_one_process_on_twice_the_batch(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent("""
        import sys, torch, framework as fw
        from toy import LinearModel, regression_data
        model = LinearModel(lr=0.05)
        trainer = fw.Trainer(accelerator="cuda", devices=2, strategy="ddp_nccl", max_epochs=2,
                             num_sanity_val_steps=0, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False)
        trainer.fit(model, torch.utils.data.DataLoader(regression_data(64), batch_size=4))
        torch.save({k: v.cpu() for k, v in model.state_dict().items()}, f"{sys.argv[1]}/rank{trainer.global_rank}.pt")
    """))
    proc = subprocess.run([sys.executable, str(script), str(tmp_path)], cwd=ROOT, env=subprocess_env(),
                          capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr
    p0, p1 = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")
    single, _ = _fit("single", 1, 8)
    for key, value in single.state_dict().items():
        assert torch.equal(p0[key], p1[key])
        torch.testing.assert_close(p0[key], value.cpu(), atol=1e-5, rtol=0)


@needs_2_gpus
def test_dp_two_gpus_splits_the_batch():
    sizes = []

    class Sizes(LinearModel):
        def training_step(self, batch, batch_idx):
            sizes.append((batch[0].device.index, len(batch[0])))
            return super().training_step(batch, batch_idx)

    trainer = fw.Trainer(accelerator="cuda", devices=2, strategy="dp", max_epochs=1, **QUIET)
    trainer.fit(Sizes(), loader(regression_data(16), 8))
    assert sorted(set(sizes)) == [(0, 4), (1, 4)]


def test_without_gpu_the_cuda_paths_say_why():
    if GPUS:
        pytest.skip("this machine has a GPU: the error paths for machines without one do not apply")
    with pytest.raises(ConfigError, match="CUDA is not available"):
        fw.Trainer(accelerator="cuda")
    with pytest.raises(ConfigError, match="ddp_nccl needs CUDA"):
        fw.Trainer(accelerator="cpu", strategy="ddp_nccl")
    with pytest.warns(UserWarning, match="no GPU in use"):
        model, _ = _fit("dp", 1, 8, accelerator="cpu")
    _assert_close_to(model, _cpu_reference(8), atol=0)


MANUAL = textwrap.dedent("""
    import sys, torch, framework as fw
    from lightning.modules import gan_loader, make_gan
    devices, precision, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    fw.seed_everything(0)
    model = make_gan(fw.TrainModule)()
    trainer = fw.Trainer(accelerator="cuda", devices=devices, strategy="ddp_nccl" if devices > 1 else "single",
                         precision=precision, max_epochs=2, num_sanity_val_steps=0, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, gan_loader(8 // devices))
    if trainer.is_global_zero:
        torch.save({"state": {k: v.cpu() for k, v in model.state_dict().items()}, "step": trainer.global_step}, out)
""")


def _manual_gan(tmp_path, devices: int, precision: str = "32") -> dict:
    script = tmp_path / "manual.py"
    script.write_text(MANUAL)
    out = tmp_path / f"gan-{devices}-{precision}.pt"
    proc = subprocess.run([sys.executable, str(script), str(devices), precision, str(out)], cwd=ROOT,
                          env=subprocess_env(), capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr
    return torch.load(out)


@needs_gpu
@pytest.mark.timeout(180)
@pytest.mark.parametrize("precision", ["32", "16-mixed", "bf16-mixed"])
def test_manual_optimization_gan_on_one_gpu(tmp_path, precision):
    got = _manual_gan(tmp_path, 1, precision)
    assert got["step"] == 32
    assert all(torch.isfinite(v).all() for v in got["state"].values())


@needs_2_gpus
@pytest.mark.timeout(240)
def test_manual_optimization_gan_on_two_gpus_over_nccl_equals_one_gpu(tmp_path):
    one, two = _manual_gan(tmp_path, 1), _manual_gan(tmp_path, 2)
    for key, value in one["state"].items():
        torch.testing.assert_close(two["state"][key], value, atol=1e-5, rtol=0)
