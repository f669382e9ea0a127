"""benchmarks/ reads as a suite: ``run.py --list`` names every ``bench_*.py`` and launches each the
way it needs (torchrun for the multi-rank ones), every script opens with a docstring that says
what it measures, why, how to read it and how long it takes, every report has its JSON beside it
with the results it quotes still there, and the README stays a summary whose links resolve."""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPTS = sorted(BENCHMARKS.glob("bench_*.py"))


def load_runner():
    spec = importlib.util.spec_from_file_location("benchmarks_run", BENCHMARKS / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def test_the_list_names_every_benchmark_script_and_nothing_else(capsys):
    assert load_runner().main(["--list"]) == 0
    listed = {line.split()[0] for line in capsys.readouterr().out.splitlines()
              if line and not line[0].isspace() and line.split()[0] not in ("name", "Which", "Each")}
    assert listed == {path.stem.removeprefix("bench_") for path in SCRIPTS}
    assert len(SCRIPTS) >= 5


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda path: path.stem)
def test_every_benchmark_opens_with_what_why_how_to_read_and_how_long(path):
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    assert doc, f"{path.name} opens with no docstring"
    first = doc.split("\n\n")[0]
    assert len(first) > 30, f"{path.name}: the first paragraph should say what it measures"
    for label in ("Why:", "Read:", "Time:", "Run:"):
        assert re.search(rf"^{label} \S", doc, re.MULTILINE), f"{path.name}'s docstring has no '{label}' line"
    assert f"run.py {path.stem.removeprefix('bench_')}" in doc, f"{path.name}: 'Run:' should show run.py's command"


def test_every_other_python_file_of_the_folder_opens_with_a_docstring():
    for path in sorted(BENCHMARKS.glob("*.py")):
        assert ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))), path.name


def test_multi_rank_benchmarks_start_under_torchrun_and_single_means_one_process(capsys):
    runner = load_runner()
    assert runner.main(["--dry-run", "fit", "--quick"]) == 0
    assert "torch.distributed.run --standalone --nproc-per-node 2" in capsys.readouterr().out
    for argv in (["--dry-run", "fit", "--single"], ["--dry-run", "--ranks", "1", "fit"], ["--dry-run", "loop"]):
        assert runner.main(argv) == 0
        out = capsys.readouterr().out
        assert "torch.distributed.run" not in out and "bench_" in out, argv
    assert runner.main(["no-such-benchmark"]) == 2
    assert "no benchmark named" in capsys.readouterr().err


def test_every_report_has_its_json_beside_it_and_the_results_it_quotes_exist():
    reports = sorted((BENCHMARKS / "reports").glob("*.md"))
    assert reports
    for report in reports:
        assert re.fullmatch(r"\d{4}-\d\d-\d\d-[a-z0-9-]+", report.stem), report.name
        numbers = json.loads(report.with_suffix(".json").read_text(encoding="utf-8"))
        assert numbers["report"] == report.name and numbers["date"] == report.stem[:10]
        assert numbers["figures"], f"{report.with_suffix('.json').name} holds no figures"
        for result in numbers["results"]:
            assert (report.parent / result).is_file(), f"{report.name} quotes {result}, which is gone"
    assert not set((BENCHMARKS / "reports").glob("*.json")) - {r.with_suffix(".json") for r in reports}


def test_the_readme_is_a_summary_under_10_kb_whose_links_resolve():
    readme = BENCHMARKS / "README.md"
    assert readme.stat().st_size < 10_000
    text = readme.read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)#]+)\)", text):
        assert (readme.parent / target).exists(), f"README.md links to {target}, which is not there"
    for path in SCRIPTS:
        assert f"`{path.stem.removeprefix('bench_')}`" in text, f"README.md does not say how to run {path.name}"


def test_a_new_report_starts_as_a_pair_quoting_kept_results_and_never_overwrites(tmp_path, monkeypatch):
    runner = load_runner()
    monkeypatch.setattr(runner, "HERE", tmp_path)
    (tmp_path / "reports").mkdir()
    (tmp_path / "results").mkdir()
    kept = tmp_path / "results" / "fit_single-2026-12-07-amd-epyc-2c.json"
    kept.write_text(json.dumps({"machine": {"hardware": "amd-epyc-2c"}}))
    md, numbers = runner.new_report("fit-overhead", [str(kept)])
    doc = json.loads(numbers.read_text())
    assert md.name == doc["report"] and md.stem == numbers.stem and md.stem.endswith("-fit-overhead")
    assert doc["results"] == ["../results/fit_single-2026-12-07-amd-epyc-2c.json"]
    assert doc["machine"] == {"hardware": "amd-epyc-2c"}
    with pytest.raises(SystemExit, match="exists already"):
        runner.new_report("fit-overhead", [str(kept)])
    with pytest.raises(SystemExit, match="not a file of benchmarks/results/"):
        runner.new_report("elsewhere", [str(tmp_path / "x.json")])
