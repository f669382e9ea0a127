"""``fw bench --quick`` as a user runs it: the installed command, real worker processes (Gloo
through torch's elastic agent, MPI through mpiexec), real files. Checks what it wrote (schema,
numbers from every backend and strategy the machine has, the files, the machine's load, and a
recommendation that follows the trust rules whatever the load was), never how fast anything was.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import statistics
from pathlib import Path

import pytest
from timescale import scaled

from tests.distributed.helpers import FW, PYTHON, clean_env, run_cmd
from tests.mpi_helpers import mpiexec, needs_mpi, skip_reason

OPS = {"all_reduce": lambda n: 2 * (n - 1) / n, "broadcast": lambda n: 1.0,
       "all_gather": lambda n: (n - 1) / n, "reduce_scatter": lambda n: (n - 1) / n}  # fmt: skip
WORKLOADS = {"digits_mlp", "cnn", "gpt"}
HAS_MPI = skip_reason() is None
HAS_LIGHTNING = importlib.util.find_spec("pytorch_lightning") is not None


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    result = run_cmd([FW, "bench", "--quick", "--out", str(out)], timeout=280, env=clean_env())
    (doc_path,) = out.glob("bench-*.json")
    return result, json.loads(doc_path.read_text()), out


def finite(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


@pytest.mark.timeout(300)  # the first runs `fw bench --quick` (~70 s here, 127 s on a slower machine)
def test_the_command_runs_every_job_and_writes_its_files(quick):
    result, doc, out = quick
    assert result.returncode == 0, result.output
    assert doc["schema"] == 2 and doc["quick"] is True
    assert {"hardware", "cpu_count", "date"} <= set(doc["machine"]) and doc["versions"]["torch"]
    names = {job["name"]: job["status"] for job in doc["jobs"]}
    assert names.pop("single-1") == "ok" and names.pop("gloo-2") == "ok"
    assert names == ({"mpi-2": "ok"} if HAS_MPI else {})
    stem = out / Path(doc["plots"][0]).name.rsplit("-", 1)[0]
    assert {p.rsplit("-", 1)[1] for p in doc["plots"]} == {"comm.png", "train.png", "breakdown.png"}
    for name in [*doc["plots"], stem.name + ".md"]:
        assert (out / name).stat().st_size > 1000, name
    # every Markdown table has as many cells in each row as in its header
    counts: list[int] = []
    for line in [*(out / f"{stem.name}.md").read_text().splitlines(), ""]:
        if line.startswith("|"):
            counts.append(line.count("|"))
        else:
            assert len(set(counts)) <= 1, (line, counts)
            counts = []
    # progress while it ran, then the table, the files and the recommendation on stdout
    assert "fw bench [gloo-2] train: gpt under ddp_gloo" in result.output
    assert "files: " in result.output and "recommendation (from this run):" in result.output


@pytest.mark.timeout(300)  # the first runs `fw bench --quick` (~70 s here, 127 s on a slower machine)
def test_every_backend_measured_every_collective_at_every_size(quick):
    _, doc, _ = quick
    (comm,) = [p["comm"] for p in doc["parts"] if p.get("comm")]
    n = comm["world_size"]
    assert set(comm["backends"]) == ({"gloo", "fw_mpi", "mpi4py"} if HAS_MPI else {"gloo"})
    cells = {(r["op"], r["backend"], r["bytes"]): r for r in comm["collectives"]}
    assert set(cells) == {(op, b, s) for op in OPS for b in comm["backends"] for s in comm["sizes"]}
    ceiling = {r["bytes"]: r for r in comm["memcpy"]["cpu"]}
    for (op, _, size), row in cells.items():
        assert len(row["samples_s"]) == row["iters"] >= 3 and row["median_s"] == statistics.median(row["samples_s"])
        assert finite(row["median_s"]) and row["min_s"] <= row["median_s"] <= row["max_s"]
        assert row["algbw_GBps"] == pytest.approx(size / row["median_s"] / 1e9)
        assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"] * OPS[op](n))
        assert row["fraction_of_memcpy"] == pytest.approx(row["busbw_GBps"] / ceiling[size]["algbw_GBps"])
    assert {r["backend"] for r in comm["ping_pong"]} == set(comm["backends"])
    assert all(finite(r["latency_s"]) for r in comm["ping_pong"])


@pytest.mark.timeout(300)  # the first runs `fw bench --quick` (~70 s here, 127 s on a slower machine)
def test_every_strategy_trained_every_workload_beside_the_hand_written_loop(quick):
    _, doc, _ = quick
    strategies = {"single", "ddp_gloo", *(["mpi"] if HAS_MPI else [])}
    rows = {(r["workload"], r["strategy"], r["side"]): r for r in doc["train"]}
    for workload in WORKLOADS:
        for strategy in strategies:
            sides = {"raw", "fw"} | ({"lightning"} if HAS_LIGHTNING and strategy != "mpi" else set())
            for side in sides:
                row = rows[(workload, strategy, side)]
                assert finite(row["samples_per_s"]) and finite(row["peak_memory_MB"]) and row["steps_timed"] >= 4
                parts = row["parts_s"]
                assert parts["forward_backward"] > 0 and all(v >= 0 for v in parts.values())
                # one process has nothing to all-reduce; DDP's all-reduce takes time
                assert (parts["comm_unhidden"] == 0) == (strategy == "single"), (workload, strategy, side, parts)
                assert row["param_MB_per_rank"] == rows[(workload, "single", "raw")]["param_MB_per_rank"] > 0
                # measured, or refused as implausible (a busy machine) with the reason: never missing
                if strategy != "single":
                    assert finite(row.get("scaling_efficiency") or row["refused"]["scaling_efficiency"])
                if side != "raw":
                    assert finite(row.get("step_over_raw") or row["refused"]["step_over_raw"])
                assert ("refused" in row) == ("untrusted" in row)
    # fsdp beside DDP on the GPT, fw and the hand-written FSDP2 loop: half the parameters per rank
    # (its gathers and reduce-scatters run inside forward and backward: no DDP all-reduce to time)
    full = rows[("gpt", "single", "raw")]["param_MB_per_rank"]
    for side in ("raw", "fw"):
        row = rows[("gpt", "fsdp", side)]
        assert finite(row["samples_per_s"]) and row["world_size"] == 2 and row["steps_timed"] >= 4
        assert full / 2 <= row["param_MB_per_rank"] < full * 0.55
    assert ("gpt", "fsdp", "lightning") not in rows and ("cnn", "fsdp", "fw") not in rows
    knobs = {(r["workload"], tuple(sorted(r["ddp_kwargs"].items()))) for r in doc["knobs"]}
    assert len(knobs) == 4 and {w for w, _ in knobs} == {"gpt"}  # --quick: the 4 settings on the GPT alone


@pytest.mark.timeout(300)  # the first runs `fw bench --quick` (~70 s here, 127 s on a slower machine)
def test_the_recommendation_follows_the_numbers(quick):
    from framework.bench.trust import overlaps

    _, doc, _ = quick
    fw_rows = [r for r in doc["train"] if r["side"] == "fw"]
    for workload in WORKLOADS:  # a refused value, overlapping spreads or a winner: as the numbers say
        ranked = sorted((r for r in fw_rows if r["workload"] == workload and r["precision"] == "32-true"),
                        key=lambda r: -r["samples_per_s"])
        best = ranked[0]  # a tie is any candidate whose spread meets the best's, not only the runner-up's
        tied = [r for r in ranked[1:] if overlaps(best["spread_samples_per_s"], r["spread_samples_per_s"])]
        line = next(ln for ln in doc["recommendation"] if ln.startswith(f"{workload}:"))
        if any("untrusted" in r for r in doc["train"] if r["workload"] == workload):
            assert line.startswith(f"{workload}: no recommendation, the measurements are not trustworthy"), line
        elif tied:
            assert line.startswith(f"{workload}: not distinguishable here: `{best['strategy']}` x{best['world_size']}"), line
            assert all(f"`{r['strategy']}` x{r['world_size']}" in line for r in tied), line
        else:
            assert line.startswith(f"{workload}: train with `{best['strategy']}` on {best['world_size']} process"), line
    assert any(ln.startswith("DDP settings for gpt") for ln in doc["recommendation"])
    fsdp = [ln for ln in doc["recommendation"] if ln.startswith("fsdp or DDP for gpt (x2)")]
    fw_gpt = {r["strategy"]: r for r in fw_rows if r["workload"] == "gpt"}
    if "untrusted" not in fw_gpt["fsdp"] and "untrusted" not in fw_gpt["ddp_gloo"]:
        ratio = fw_gpt["fsdp"]["samples_per_s"] / fw_gpt["ddp_gloo"]["samples_per_s"]
        assert f"at {ratio:.2f}x `ddp_gloo`'s samples/s" in fsdp[0]
    else:
        assert fsdp == []


@pytest.mark.timeout(300)  # the first runs `fw bench --quick` (~70 s here, 127 s on a slower machine)
def test_the_load_is_recorded_before_and_during_every_job_and_judged_by_the_rule(quick):
    from framework.bench.load import busy_verdict

    result, doc, out = quick
    load = doc["load"]
    assert load["cores"] == len(os.sched_getaffinity(0)) and len(load["before"]["loadavg"]) == 3
    assert list(load["jobs"]) == [job["name"] for job in doc["jobs"]]
    for name, job in load["jobs"].items():  # each job's own processes told apart from the rest
        assert job["seconds"] > 1 and 0 <= job["others_share"] <= job["busy_share"] <= 1, (name, job)
        assert job["own_share"] > 0, (name, job)
    assert {s["job"] for s in load["samples"]} >= set(load["jobs"])
    busy = busy_verdict(load)
    assert doc["warnings"] == busy + [u for r in doc["train"] for u in r.get("untrusted", [])]
    assert doc["recommendation"][0].startswith("not trustworthy here") == bool(busy)
    for warning in doc["warnings"]:  # a logging warning on stderr, a line on stdout, and in the report
        assert f"fw bench: warning: {warning}\n" in result.output and f"\nwarning: {warning}\n" in result.output
    md = next(out.glob("bench-*.md")).read_text()
    assert ("## Warnings" in md) == bool(doc["warnings"]) and "## machine load on" in md


@needs_mpi
@pytest.mark.timeout(60)
def test_under_mpiexec_it_uses_the_processes_it_was_given(tmp_path):
    cmd = [mpiexec(), "-n", "2", PYTHON, "-m", "mpi4py", "-m", "framework.cli", "bench", "--quick", "--suite", "comm",
           "--out", str(tmp_path)]  # fmt: skip
    result = run_cmd(cmd, timeout=100, env=clean_env())
    assert result.returncode == 0, result.output
    (doc,) = [json.loads(p.read_text()) for p in tmp_path.glob("bench-*.json")]
    assert [job["name"] for job in doc["jobs"]] == ["mpi-2"] and doc["parts"][0]["launcher"] == "mpi"
    assert set(doc["parts"][0]["comm"]["backends"]) == {"gloo", "fw_mpi", "mpi4py"}


@pytest.mark.slurm
@pytest.mark.timeout(60)
def test_under_srun_it_uses_the_tasks_it_was_given(tmp_path):
    from tests.environments.test_slurm_cluster import _slurm_up

    if _slurm_up() is not None:
        pytest.skip(_slurm_up())
    cmd = ["srun", "-n", "2", FW, "bench", "--quick", "--suite", "comm", "--out", str(tmp_path)]
    result = run_cmd(cmd, timeout=100, env=clean_env(), cwd=tmp_path)
    assert result.returncode == 0, result.output
    (doc,) = [json.loads(p.read_text()) for p in tmp_path.glob("bench-*.json")]
    assert [job["name"] for job in doc["jobs"]] == ["gloo-2"] and doc["parts"][0]["launcher"] == "slurm"
    assert doc["parts"][0]["comm"]["backends"] == ["gloo"]


@pytest.mark.timeout(60)
def test_under_torchrun_it_uses_the_processes_it_was_given(tmp_path):
    cmd = [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "framework.cli",
           "bench", "--quick", "--suite", "comm", "--out", str(tmp_path)]  # fmt: skip
    result = run_cmd(cmd, timeout=100, env=clean_env())
    assert result.returncode == 0, result.output
    (doc,) = [json.loads(p.read_text()) for p in tmp_path.glob("bench-*.json")]
    assert [job["name"] for job in doc["jobs"]] == ["gloo-2"] and doc["parts"][0]["launcher"] == "torchrun"
    assert doc["parts"][0]["comm"]["world_size"] == 2


def _marked(mark: str) -> list[int]:
    """The processes whose environment holds ``FW_TEST_MARK=mark``."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if f"FW_TEST_MARK={mark}".encode() in environ.read_bytes().split(b"\0"):
                found.append(int(environ.parent.name))
        except OSError:
            continue
    return found


@pytest.mark.timeout(90)
def test_sigterm_kills_the_running_job_and_reports_the_jobs_before_it(tmp_path):
    import signal
    import subprocess
    import time
    import uuid

    from framework.strategies.launchers.processes import kill_tree

    mark = uuid.uuid4().hex
    proc = subprocess.Popen([FW, "bench", "--quick", "--suite", "train", "--out", str(tmp_path)],
                            env=clean_env(FW_TEST_MARK=mark), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        for line in proc.stderr:  # progress lines; the second job's start is the cue
            lines.append(line)
            if re.match(r"fw bench: \[\d+/\d+\] gloo-2:", line):  # single-cuda may come before it
                break
        deadline = time.monotonic() + 30
        while len(_marked(mark)) < 4 and time.monotonic() < deadline:  # fw bench, the agent, 2 workers
            time.sleep(0.1)
        assert len(_marked(mark)) >= 4, "".join(lines)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=scaled(60))
        deadline = time.monotonic() + 10  # the killed workers are gone (reaped by init)
        while _marked(mark) and time.monotonic() < deadline:
            time.sleep(0.2)
        survivors = _marked(mark)
    finally:  # whatever happened, no process of this run outlives the test
        for pid in [proc.pid, *_marked(mark)]:
            kill_tree(pid)
        proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, "".join(lines) + err
    assert "stopped by SIGTERM during gloo-2" in err and "Traceback" not in err, err
    (doc,) = [json.loads(p.read_text()) for p in tmp_path.glob("bench-*.json")]
    names = [job["name"] for job in doc["jobs"]]
    at = names.index("gloo-2")
    assert [job["status"] for job in doc["jobs"]] == \
        ["ok"] * at + ["stopped by SIGTERM"] + ["not run (fw bench was stopped)"] * (len(names) - at - 1)
    assert names[:at] in (["single-1"], ["single-1", "single-cuda"]) and names[at + 1:] == (["mpi-2"] if HAS_MPI else [])
    rows = {(r["workload"], r["strategy"]) for r in doc["train"]}  # the single-process jobs' alone
    assert {(w, "single") for w in WORKLOADS} <= rows and {s for _, s in rows} <= {"single", "dp"}
    assert "recommendation (from this run):" in out
    assert survivors == []


@pytest.mark.parametrize(("name", "peak"), [
    ("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H100 PCIe", 756e12), ("NVIDIA H100 NVL", 835e12),
    ("NVIDIA H200", 989e12), ("NVIDIA H200 NVL", 835e12), ("NVIDIA A100-SXM4-80GB", 312e12),
    ("NVIDIA A100 80GB PCIe", 312e12), ("NVIDIA L40S", 362e12), ("NVIDIA L4", 121e12), ("NVIDIA A10", 125e12),
    ("NVIDIA GH200 480GB", 989e12), ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", None), ("nvidia h100 pcie", 756e12),
    ("NVIDIA A10G", None), ("NVIDIA GeForce RTX 4090", None),
])  # fmt: skip
def test_mfu_uses_the_peak_of_the_exact_gpu_and_none_for_an_unknown_one(name, peak):
    from framework.bench.report import peak_for

    assert peak_for(name) == peak
