"""FSDP on CUDA over NCCL (issue 18, item 9): one GPU in float32 and bf16-mixed, and 2 GPUs
against one, with a sharded checkpoint that resumes. Without GPUs they skip with the reason; on
the GPU machine they run (results recorded in benchmarks/results/gpu-tests-*.txt).

Each case runs in a fresh interpreter (``tests/distributed/sharded.py``'s fit): a sharded run
keeps its process group until its process ends, and CUDA does not survive a fork."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import ROOT, subprocess_env

pytestmark = pytest.mark.gpu
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
needs_gpu = pytest.mark.skipif(GPUS < 1, reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
needs_2_gpus = pytest.mark.skipif(GPUS < 2, reason=f"needs 2 CUDA GPUs, this machine has {GPUS}")
FSDP = {"name": "fsdp", "auto_wrap_policy": ["Block"]}
TOLERANCE = 1e-5  # as on the CPU (tests/distributed/test_fsdp.py)

SCRIPT = textwrap.dedent("""
    import json, sys, torch
    sys.path.insert(0, {distributed!r})
    import sharded
    from framework.callbacks import ModelCheckpoint
    case, out = json.loads(sys.argv[1]), sys.argv[2]
    callbacks = [ModelCheckpoint(dirpath=f"{{out}}/ck", every_n_train_steps=10, save_top_k=-1)] if case.get("checkpoint") else None
    run = sharded.fit(case["strategy"], devices=case["devices"], accelerator="cuda", root=out, callbacks=callbacks,
                      ckpt_path=case.get("resume"), **case.get("trainer", {{}}))
    if run["rank"] == 0:
        torch.save(run, f"{{out}}/{{case['tag']}}.pt")
""")


def _run(tmp_path, tag: str, strategy, devices: int, **case) -> dict:
    script = tmp_path / "fit.py"
    script.write_text(SCRIPT.format(distributed=str(ROOT / "tests" / "distributed")))
    spec = {"tag": tag, "strategy": strategy, "devices": devices, **case}
    proc = subprocess.run([sys.executable, str(script), json.dumps(spec), str(tmp_path)], cwd=ROOT,
                          env=subprocess_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return torch.load(tmp_path / f"{tag}.pt")


def _gap(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@needs_gpu
@pytest.mark.timeout(300)
def test_fsdp_on_one_gpu_ends_where_the_single_device_strategy_ends(tmp_path):
    sharded_run = _run(tmp_path, "fsdp", FSDP, 1, trainer={"shuffle": True})
    single = _run(tmp_path, "single", "single", 1, trainer={"shuffle": True})
    assert sharded_run["sharded"] and sharded_run["global_step"] == single["global_step"] == 20
    gap = _gap(sharded_run["weights"], single["weights"])
    print(f"fsdp x1 against single on cuda: {gap:.3g}")
    assert gap < TOLERANCE


@needs_gpu
@pytest.mark.timeout(300)
def test_bf16_mixed_fsdp_on_one_gpu_stays_within_bf16_rounding(tmp_path):
    sharded_run = _run(tmp_path, "fsdp_bf16", FSDP, 1, trainer={"precision": "bf16-mixed"})
    single = _run(tmp_path, "single_bf16", "single", 1, trainer={"precision": "bf16-mixed"})
    fp32 = _run(tmp_path, "single_32", "single", 1)
    gap = _gap(sharded_run["weights"], single["weights"])
    print(f"bf16-mixed fsdp x1 against bf16-mixed single on cuda: {gap:.3g}")
    assert gap < 5e-3  # on the CPU: 1.8e-3 (bf16 itself moves the run 1.9e-3 from float32)
    assert _gap(sharded_run["weights"], fp32["weights"]) > 1e-4  # the policy was applied


@needs_2_gpus
@pytest.mark.timeout(400)
def test_fsdp_on_two_gpus_over_nccl_equals_one_gpu_and_resumes_its_sharded_checkpoint(tmp_path):
    two = _run(tmp_path, "fsdp2", FSDP, 2, trainer={"shuffle": True}, checkpoint=True)
    one = _run(tmp_path, "single", "single", 1, trainer={"shuffle": True})
    gap = _gap(two["weights"], one["weights"])
    print(f"fsdp x2 over nccl against one gpu: {gap:.3g}")
    assert gap < TOLERANCE and two["local_numel"] < 0.55 * sum(w.numel() for w in one["weights"].values())
    folder = tmp_path / "ck" / "epoch=0-step=10.ckpt"
    assert (folder / "COMMITTED").exists()
    resumed = _run(tmp_path, "resumed", FSDP, 2, trainer={"shuffle": True}, resume=str(folder))
    assert resumed["global_step"] == 20 and _gap(resumed["weights"], two["weights"]) == 0
