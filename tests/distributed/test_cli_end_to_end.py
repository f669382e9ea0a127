"""End to end: ``fw fit`` from a plain shell with 2 devices starts 2 Gloo workers and trains, and
under torchrun follows the launcher (FSDP there ends with DDP's numbers)."""

from __future__ import annotations

import pytest

from .helpers import FW, REPO, run_cmd


@pytest.mark.timeout(60)
def test_under_torchrun_devices_auto_follows_the_launcher_and_a_single_strategy_is_refused(tmp_path):
    """``fw fit`` as torchrun's 2 workers see it (its variables; the ranks forked from the test
    process, tests/forked.py: the next test runs the real torchrun)."""
    import forked

    from .helpers import clean_env

    args = ["fit", "conf/regression.yaml", "trainer.max_epochs=1", "logger=false", f"trainer.default_root_dir={tmp_path}"]
    result = forked.fw_command(*args, "trainer.devices=auto", cwd=REPO, env=clean_env(), nprocs=2)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "strategy ddp_gloo" in result.stderr and "world size 2" in result.stderr, result.stderr

    # devices=1 under 2 of torchrun's processes: "auto" is ddp (the launcher's job is data parallel), whose
    # devices then disagree with the launcher's count
    result = forked.fw_command(*args, "trainer.devices=1", cwd=REPO, env=clean_env(), nprocs=2)
    assert result.returncode != 0
    assert "started 2 process(es) on this node but trainer.devices=1" in result.stderr, result.stderr

    result = forked.fw_command(*args, "trainer.strategy=single", cwd=REPO, env=clean_env(), nprocs=2)
    assert result.returncode != 0
    assert "torchrun started 2 processes but trainer.strategy=single" in result.stderr, result.stderr


@pytest.mark.timeout(180)
def test_fw_fit_digits_under_fsdp_and_torchrun_gives_ddp_s_numbers(tmp_path):
    """The recipe with torchmetrics, validation every epoch, checkpoints and an LR schedule: from a
    plain shell with 2 devices, ``fw fit`` starts 2 Gloo workers and trains (rank 0 alone prints);
    FSDP on 2 ranks under torchrun ends with the metrics DDP ends with under fw's launcher."""
    from .helpers import PYTHON, free_port

    common = ["fit", "conf/digits.yaml", "trainer.max_epochs=2", "trainer.enable_progress_bar=false"]
    ddp = run_cmd([FW, *common, "trainer.devices=2", "trainer.strategy=ddp_gloo",
                   f"trainer.default_root_dir={tmp_path / 'ddp'}"], timeout=100, cwd=REPO)
    fsdp = run_cmd([PYTHON, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
                    "--master-port", str(free_port()), "-m", "framework.cli", *common, "trainer.devices=2", "trainer.strategy=fsdp",
                    f"trainer.default_root_dir={tmp_path / 'fsdp'}"], timeout=100, cwd=REPO)
    assert ddp.returncode == 0 and fsdp.returncode == 0, ddp.output + fsdp.output
    assert "strategy fsdp" in fsdp.output and "world size 2" in fsdp.output, fsdp.output
    summary = [line for line in ddp.output.splitlines() if line.startswith("fw fit: strategy")]
    assert len(summary) == 1 and "strategy ddp_gloo" in summary[0] and "world size 2" in summary[0], ddp.output
    assert (tmp_path / "ddp" / "fw_logs" / "version_0" / "checkpoints" / "last.ckpt").exists()

    def final(output: str) -> dict[str, float]:
        (line,) = [line for line in output.splitlines() if line.startswith("fw: final metrics:")]
        return {k: float(v) for k, v in (item.split("=") for item in line.split(": ", 2)[2].split(", "))}

    ours, theirs = final(fsdp.output), final(ddp.output)
    assert ours.keys() == theirs.keys() and "val/acc" in ours
    assert all(abs(ours[k] - theirs[k]) <= 1e-3 for k in ours), (ours, theirs)
    assert (tmp_path / "fsdp" / "fw_logs" / "version_0" / "checkpoints" / "last.ckpt").exists()
