"""Every code block of README.md and docs/ runs as written, page by page (rules: blocks.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import subprocess_env
from timescale import scaled

from .blocks import ROOT, Block, blocks, pages

PAGES = pages()


def _runs_something(page: Path) -> bool:
    try:
        return any(block.runs for block in blocks(page))
    except ValueError:
        return True  # run it, to fail with the reason


def _env() -> dict[str, str]:
    env = subprocess_env()
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # `fw` as if activated
    env["MPLBACKEND"] = "Agg"
    # torch on one thread in each process: the suite's workers already share the 2 cores, and two threads per
    # process fighting for them cost CPU for nothing (the pages, -n 2, 2026-12-07, 2-core AMD EPYC, idle:
    # 425 CPU-s and 359 s with torch's default threads, 388 CPU-s and 337 s on one)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def test_every_block_follows_the_rules():
    problems = []
    for page in PAGES:
        try:
            blocks(page)
        except ValueError as err:
            problems.append(str(err))
    assert not problems, "\n".join(problems)


def _run(block: Block, index: int, folder: Path, env: dict[str, str]) -> None:
    if block.language == "python":
        script = folder / f"_block{index}.py"
        script.write_text(block.body)
        command = [sys.executable, script.name]
    else:
        command = ["bash", "-e", "-c", block.body]
    try:
        done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True,
                              timeout=scaled(block.timeout))
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"{block.where}: still running after {err.timeout:.0f} s (<!-- timeout: N --> gives it more)")
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{block.where}: exit code {done.returncode}\n{output[-4000:]}"
    for words in block.expect:
        assert words in output, f"{block.where}: the output lacks {words!r}\n{output[-4000:]}"


@pytest.mark.timeout(900)
@pytest.mark.parametrize("page", [p for p in PAGES if _runs_something(p)], ids=lambda p: str(p.relative_to(ROOT)))
def test_the_page_runs_as_written(page: Path, tmp_path: Path):
    try:
        page_blocks = blocks(page)
    except ValueError as err:
        pytest.fail(str(err))
    shutil.copytree(ROOT / "conf", tmp_path / "conf")
    env = _env()
    for index, block in enumerate(page_blocks):
        if block.file:
            path = tmp_path / block.file
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(block.body)
        elif block.runs:
            _run(block, index, tmp_path, env)
