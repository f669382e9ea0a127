"""The machine's load around a fw bench run (``framework/bench/load.py``): the monitor tells the
bench's own CPU time from other processes' (a real child burning a known amount), the rule for
"too busy to trust" at its limits, and the report saying so: Warnings, the recommendation's first
line, a logging warning, and the load kept in the JSON."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest

from framework.bench.load import BUSY_LOAD_PER_CORE, OTHERS_MAX_SHARE, LoadMonitor, busy_verdict, shares
from tests.bench.test_trust import repeats, rows

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.0: pass"


@pytest.mark.timeout(60)
def test_the_monitor_counts_the_bench_s_own_processes_apart_from_the_others():
    monitor = LoadMonitor(interval=0.2).start(settle_s=0.2)
    try:
        monitor.job("burn")
        subprocess.run([sys.executable, "-c", BURN], check=True, timeout=50)  # 1 s of CPU in a child
        monitor.job("rest")
    finally:
        load = monitor.stop()
    assert load["cores"] == len(os.sched_getaffinity(0)) and load["cpus"] == sorted(os.sched_getaffinity(0))
    burn = monitor.acc["burn"]
    assert 1.0 <= burn["own"] <= 1.6, burn  # the child's second (it ended and was reaped), its start, the sampling
    job = load["jobs"]["burn"]
    assert job["own_share"] == pytest.approx(burn["own"] * os.sysconf("SC_CLK_TCK") / burn["total"])
    assert job["busy_share"] >= job["own_share"] - 0.02  # /proc/stat saw that time too (a tick's rounding apart)
    assert job["others_share"] == pytest.approx(max(0.0, job["busy_share"] - job["own_share"]), abs=1e-9)
    assert len(load["before"]["loadavg"]) == 3 and load["before"]["seconds"] >= 0.2
    assert {s["job"] for s in load["samples"]} == {"before", "burn", "rest"}
    assert not monitor._thread.is_alive()


def _load(loadavg: float, others: dict[str, float | None], cores: int = 2) -> dict:
    jobs = {name: {"seconds": 10.0, "busy_share": 1.0, "own_share": None, "others_share": share} for name, share in others.items()}
    return {"cores": cores, "before": {"loadavg": [loadavg, 1.0, 1.0]}, "jobs": jobs}


def test_too_busy_is_load_above_the_cores_before_or_others_above_a_tenth_during():
    assert BUSY_LOAD_PER_CORE == 1.0 and OTHERS_MAX_SHARE == 0.10
    assert busy_verdict(_load(2.0, {"single-1": 0.10, "gloo-2": None})) == []  # at the limits; not known: no claim
    assert busy_verdict(_load(2.01, {})) == [
        "the machine was too busy to trust before the run: 1-minute load average 2.01 on 2 available core(s) (limit 2)"]
    assert busy_verdict(_load(0.3, {"single-1": 0.02, "gloo-2": 0.35})) == [
        "the machine was too busy to trust during gloo-2: other processes took 35% of the 2 available core(s)' time "
        "(limit 10%), time the bench's processes were sized to use"]
    assert len(busy_verdict(_load(5.0, {"a": 0.5, "b": 0.5}, cores=4))) == 3


def test_shares_of_a_window():
    tick = os.sysconf("SC_CLK_TCK")
    # 2 cores for 1 s: 2 ticks' worth; busy 90 %, of which the bench used 1.2 core-seconds
    window = shares({"seconds": 1.0, "busy": int(1.8 * tick), "total": 2 * tick, "own": 1.2})
    assert window["busy_share"] == pytest.approx(0.9) and window["own_share"] == pytest.approx(0.6)
    assert window["others_share"] == pytest.approx(0.3)
    assert shares({"seconds": 1.0, "busy": tick, "total": 2 * tick, "own": None})["others_share"] is None


@pytest.mark.timeout(60)
def test_the_report_says_the_machine_was_too_busy_and_keeps_the_load(tmp_path, capsys):
    from framework.bench.report import write_report

    load = {"cores": 2, "cpus": [0, 1], "interval_s": 1.0, "rule": "the rule",
            "before": {"loadavg": [3.3, 2.9, 2.2], "seconds": 0.5, "busy_share": 1.0, "own_share": 0.0, "others_share": 1.0},
            "during": {"seconds": 20.0, "busy_share": 1.0, "own_share": 0.6, "others_share": 0.4, "loadavg_max": 4.1,
                       "loadavg_end": [4.0, 3.0, 2.0]},
            "jobs": {"single-1": {"seconds": 20.0, "busy_share": 1.0, "own_share": 0.6, "others_share": 0.4, "loadavg_max": 4.1}},
            "samples": []}  # fmt: skip
    parts = [{"job": "single-1", "train": {"lightning": "ran", "runs": repeats("cnn", "single", 1, "fw", 100, 104)}}]
    args = argparse.Namespace(out=tmp_path, quick=True, suite="train")
    doc = json.loads(write_report(parts, [{"name": "single-1", "status": "ok", "wall_s": 20.0}], args, [], 21.0, load).read_text())
    verdict = busy_verdict(load)
    assert len(verdict) == 2 and doc["warnings"] == verdict and doc["load"] == load and doc["schema"] == 2
    assert doc["recommendation"][0].startswith(f"not trustworthy here ({verdict[0]} (and 1 more)): the lines below")
    out, err = capsys.readouterr()
    assert all(f"fw bench: warning: {v}" in err for v in verdict)  # the logging warning, on stderr
    assert all(f"warning: {v}" in out for v in verdict) and "recommendation (from this run):" in out
    md = next(tmp_path.glob("bench-*.md")).read_text()
    assert md.index("## Warnings") < md.index("## Recommendation") and verdict[1] in md
    assert "| single-1 | 20.0 | max 4.10 | 100% | 40% |" in md and "| before | 0.5 | 3.30 | 100% | 100% |" in md


def test_rows_helper_pools_repeats():  # the constructed rows the report test feeds in are real rows
    (row,) = rows(*repeats("cnn", "single", 1, "fw", 100, 104))
    assert row["repeats"] == 2 and row["spread_samples_per_s"] == pytest.approx([100, 104])
