"""``fw env``: the report runs everywhere and shows what a hung job needs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from framework.cli import env_report as report

REPO = Path(__file__).resolve().parents[1]


def test_full_report_in_a_plain_process() -> None:
    # A subprocess, because the report may initialize MPI (a singleton) in the process.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "OMPI_", "PMI", "TORCHELASTIC"))}
    env["PYTHONPATH"] = str(REPO)
    env["NCCL_DEBUG"] = "INFO"
    done = subprocess.run(
        [sys.executable, "-c", "from framework.cli.env_report import env_report; print(env_report())"],
        capture_output=True, text=True, timeout=60, env=env, cwd=REPO, check=True,
    )
    text = done.stdout
    for title in ("[system]", "[torch]", "[mpi]", "[network]", "[cluster environment]",
                  "[environment variables]"):
        assert title in text
    assert "backends" in text and "gloo=" in text
    detected = [line.split() for line in text.splitlines() if line.strip().startswith("detected")]
    assert detected == [["detected", "local"]]
    assert "NCCL_DEBUG" in text
    assert not [line for line in text.splitlines() if line.strip().startswith("error")]


def test_cluster_section_for_srun_task(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shutil.which", lambda name: None)
    env = {"SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURM_NTASKS": "2",
           "SLURM_STEP_ID": "0", "SLURM_JOB_ID": "77", "SLURM_NODELIST": "localhost",
           "SLURM_TASKS_PER_NODE": "2"}
    lines = dict(report.cluster_lines(env, argv=[]))
    assert lines["detected"] == "slurm"
    assert lines["rank"] == "1 of 2"
    assert lines["local rank"] == "1 of 2"
    assert lines["master addr"] == "localhost"
    assert lines["master port"] == "15077"
    assert lines["master resolves to"].count(".") == 3


def test_cluster_section_warns_about_the_batch_trap() -> None:
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "77"}
    lines = dict(report.cluster_lines(env, argv=[]))
    assert lines["detected"] == "local"
    assert "outside srun" in lines["WARNING"]


def test_cluster_section_reports_bad_variables() -> None:
    lines = dict(report.cluster_lines({"RANK": "x", "WORLD_SIZE": "2"}, argv=[]))
    assert "RANK='x'" in lines["error"]


def test_mpi_section_does_not_initialize_mpi_inside_srun() -> None:
    pytest.importorskip("mpi4py")
    lines = dict(report.mpi_lines({"SLURM_PROCID": "0", "SLURM_STEP_ID": "0"}))
    assert "not initialized" in lines["MPI"]


def test_network_has_loopback() -> None:
    addresses = report.interface_addresses()
    assert "127.0.0.1" in addresses.values()


def test_env_vars_only_those_set() -> None:
    lines = report.env_var_lines({"MASTER_PORT": "29500", "HOME": "/root"})
    assert lines == [("MASTER_PORT", "29500")]
    assert report.env_var_lines({}) == [("(none set)", "")]


def test_a_failing_section_does_not_stop_the_report(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> list:
        raise RuntimeError("boom")

    monkeypatch.setattr(report, "torch_lines", broken)
    monkeypatch.setattr(report, "mpi_lines", lambda env: [("mpi4py", "skipped")])
    text = report.env_report(env={}, argv=[])
    assert "RuntimeError: boom" in text
    assert "[cluster environment]" in text
