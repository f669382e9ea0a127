"""The README's code runs as written: its TrainModule example (as a script, 2 processes), and
its own-project example (the files it shows, then the command it shows, in that folder)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, subprocess_env

BLOCK = re.compile(r"<!-- README test: (?P<what>[^>]*?) -->\n```[a-z]*\n(?P<body>.*?)```", re.S)


def _blocks() -> list[tuple[str, str]]:
    return [(m["what"].strip(), m["body"]) for m in BLOCK.finditer((ROOT / "README.md").read_text())]


def _env() -> dict[str, str]:
    env = subprocess_env()
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # `fw` as if activated
    return env


def test_the_readme_has_the_blocks_this_test_runs():
    kinds = [what.split()[0] for what, _ in _blocks()]
    assert kinds.count("runs") == 1 and kinds.count("file") == 2 and kinds.count("run") == 1, kinds


@pytest.mark.timeout(60)
def test_the_trainmodule_example_runs_as_a_script(tmp_path):
    (body,) = [body for what, body in _blocks() if what.startswith("runs")]
    script = tmp_path / "example.py"
    script.write_text(body)
    proc = subprocess.run([sys.executable, str(script)], env=_env(), capture_output=True, text=True, timeout=150,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "val/loss" in proc.stdout and "train/loss" in proc.stdout  # the printed callback_metrics
    assert "fw fit: done at step" in proc.stderr and "world size 2" in proc.stderr


@pytest.mark.timeout(60)
def test_the_own_project_example_runs_from_its_folder(tmp_path):
    for what, body in _blocks():
        if what.startswith("file "):
            path = tmp_path / what.split(" ", 1)[1]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(body)
    (command,) = [body.strip() for what, body in _blocks() if what.startswith("run ")]
    proc = subprocess.run(["bash", "-c", command], env=_env(), capture_output=True, text=True, timeout=150,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("fw: final metrics: ") and "val/loss=" in proc.stdout
    assert list((tmp_path / "myproject" / "runs").rglob("*.ckpt")), "no checkpoint written"
