"""``fw bench``: which backend, strategy and DDP settings to use on this machine, measured.

    fw bench                       # all suites, every backend and world size this machine allows
    fw bench --quick               # a short run (CI: under 2 minutes on 2 cores)
    fw bench --suite comm --out results/
    mpiexec -n 4 fw bench          # under a launcher: the processes it was given
    torchrun --nproc-per-node 4 -m framework.cli bench

Suites: ``comm`` (collectives by size, ping-pong, memory-copy ceiling: ``comm.py``), ``train``
(three workloads from ``conf/bench/``, fw beside a hand-written loop and Lightning, with the
step-time breakdown: ``train.py``) and ``knobs`` (DDP bucket size, gradient_as_bucket_view,
static_graph). Started alone, fw bench runs one job per backend and world size as its own
processes (``single``; ``gloo`` through torch's elastic agent; ``mpi`` through the ``mpiexec``
it finds; ``nccl`` with two or more GPUs), each with a timeout, then writes ``report.py``'s
files and prints the tables and a recommendation computed from this run. The machine's load
is watched before and during the jobs (``load.py``); a winner the spreads do not separate, a
value physics rules out (``trust.py``) and a machine too busy to trust are said, not hidden.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType
from typing import Any

SUITES = ("comm", "train", "knobs")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="fewer sizes, steps and repeats, the DDP settings on the GPT alone: a shorter, coarser run")
    parser.add_argument("--suite", choices=(*SUITES, "all"), default="all", help="which suite to run (default all)")
    parser.add_argument("--out", type=Path, default=Path("fw-bench"), help="folder for the JSON, Markdown and plots")
    parser.add_argument("--max-world", type=int, default=None, help="largest world size to try (default: the cores)")


def mpiexec() -> str | None:
    """The ``mpiexec`` of this environment (beside the interpreter), else the one on PATH."""
    local = Path(sys.executable).parent / "mpiexec"
    if local.exists():
        return str(local)
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return None
    return shutil.which("mpiexec")


def mpiexec_flags(launcher: str) -> list[str]:
    """What this ``mpiexec`` needs to run a job as the bench's others run: Open MPI binds each
    rank to one core (``--bind-to none`` leaves them the share of the cores the job's
    OMP_NUM_THREADS gives them, as torch's elastic agent does); MPICH's Hydra binds nothing."""
    try:
        version = subprocess.run([launcher, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return ["--bind-to", "none"] if "Open MPI" in version or "OpenRTE" in version else []


def usable_cores() -> int:
    """The cores this process may run on (its affinity: a container's or SLURM's share)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def world_sizes(cores: int, quick: bool, limit: int | None) -> list[int]:
    """2, 4, 8, ... up to the cores (at least 2) and ``limit``; just 2 with --quick."""
    top = max(2, cores) if limit is None else limit
    return [n for n in ((2,) if quick else (2, 4, 8, 16, 32, 64)) if n <= top]


def plan(suites: list[str], quick: bool, limit: int | None) -> tuple[list[dict], str | None]:
    """The jobs to run (name, command, environment, suites, timeout), and the mpiexec found."""
    import torch

    py, cores = sys.executable, usable_cores()
    worker = ["-m", "framework.bench.worker", *(["--quick"] if quick else [])]
    timeout = 240 if quick else 3600
    jobs: list[dict[str, Any]] = []
    mpi = mpiexec()
    mpi_flags = mpiexec_flags(mpi) if mpi else []
    if "train" in suites:
        jobs.append({"name": "single-1", "cmd": [py, *worker, "--kind", "single", "--suites", "train"], "env": {}})
        if torch.cuda.is_available():
            jobs.append({"name": "single-cuda", "cmd": [py, *worker, "--kind", "single", "--suites", "train"],
                         "env": {"FW_BENCH_DEVICE": "cuda"}})  # fmt: skip
    for i, n in enumerate(world_sizes(cores, quick, limit)):
        threads = {"OMP_NUM_THREADS": str(max(1, cores // n))}
        # the collectives side by side in one job: Gloo, fw_mpi and raw mpi4py under mpiexec
        gloo = [s for s in suites if s == "train" or (s == "knobs" and i == 0) or (s == "comm" and not mpi)]
        if gloo:
            cmd = [py, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n), *worker,
                   "--kind", "gloo", "--suites", ",".join(gloo)]  # fmt: skip
            jobs.append({"name": f"gloo-{n}", "cmd": cmd, "env": threads})
        mpi_suites = [s for s in suites if s in ("comm", "train")]
        if mpi and mpi_suites:
            cmd = [mpi, "-n", str(n), *mpi_flags, py, "-m", "mpi4py", *worker, "--kind", "mpi",
                   "--suites", ",".join(mpi_suites)]  # fmt: skip
            jobs.append({"name": f"mpi-{n}", "cmd": cmd, "env": threads})
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus >= 2:
        cmd = [py, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(gpus), *worker,
               "--kind", "nccl", "--suites", ",".join(suites)]  # fmt: skip
        jobs.append({"name": f"nccl-{gpus}", "cmd": cmd, "env": {}})
    for job in jobs:
        job["suites"], job["timeout_s"] = suites, timeout
    return jobs, mpi


def run_job(job: dict, part: Path, index: int, count: int) -> dict:
    """Run one job's processes (their progress lines pass through to stderr); its record."""
    from framework.strategies.launchers.processes import kill_tree

    cmd = [*job["cmd"], "--part", str(part)]
    sys.stderr.write(f"fw bench: [{index}/{count}] {job['name']}: {' '.join(Path(c).name if i == 0 else c for i, c in enumerate(cmd))}\n")
    sys.stderr.flush()
    start = time.perf_counter()
    record: dict[str, Any] = {"name": job["name"], "cmd": cmd, "timeout_s": job["timeout_s"]}
    proc = subprocess.Popen(cmd, env={**os.environ, **job["env"]}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)  # fmt: skip
    tail: list[str] = []
    try:
        _pass_progress(proc, tail, start + job["timeout_s"])
        proc.wait(timeout=max(1.0, start + job["timeout_s"] - time.perf_counter()))
    except subprocess.TimeoutExpired:
        pass
    except BaseException:  # Ctrl-C: leave no worker behind
        kill_tree(proc.pid)
        raise
    finally:
        if proc.poll() is None:  # past its timeout (or interrupted): end the launcher and every worker
            kill_tree(proc.pid)
            proc.wait()
            record["status"] = f"timed out after {job['timeout_s']} s"
    record["wall_s"] = time.perf_counter() - start
    if "status" not in record:
        record["status"] = "ok" if proc.returncode == 0 and part.exists() else f"failed (exit {proc.returncode})"
    if record["status"] != "ok":
        record["stderr_tail"] = "".join(tail[-30:])
        sys.stderr.write(f"fw bench: {job['name']} {record['status']}; the rest goes on. Its last lines:\n{''.join(tail[-30:])}")
    return record


def _pass_progress(proc: subprocess.Popen, tail: list[str], deadline: float) -> None:
    """Forward the workers' ``fw bench [...]`` lines; keep the rest for an error report. Reads
    what is there (never waits for the end of a line), so the deadline holds."""
    import selectors

    assert proc.stderr is not None, "started with stderr=PIPE"
    fd, pending = proc.stderr.fileno(), b""
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ)
    while time.perf_counter() < deadline:
        if not sel.select(timeout=0.5):
            if proc.poll() is not None:
                break
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        *lines, pending = (pending + chunk).split(b"\n")
        for line in (raw.decode(errors="replace") + "\n" for raw in lines):
            if line.startswith("fw bench ["):
                sys.stderr.write(line)
                sys.stderr.flush()
            else:
                tail.append(line)
                del tail[:-200]


def main(args: argparse.Namespace) -> int:
    from framework.bench.context import launched_by

    suites = list(SUITES) if args.suite == "all" else [args.suite]
    if {"train", "knobs"} & set(suites):
        _check_recipes()
    if launched_by() is not None:
        return _as_worker(args, suites)
    from framework.bench.load import LoadMonitor

    jobs, mpi = plan(suites, args.quick, args.max_world)
    monitor = LoadMonitor().start()  # before the first job, then sampled while they run
    start = time.perf_counter()
    parts: list[dict] = []
    records: list[dict] = []
    notes = [] if mpi else ["no mpiexec found (pip install 'fw[mpi]'): the MPI jobs did not run"]
    stopped_by = None
    # SIGTERM (a scheduler's, a timeout's) and Ctrl-C stop fw bench: the running job's processes
    # are killed (run_job) and what finished before it is still reported
    before = {sig: signal.signal(sig, _stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        with tempfile.TemporaryDirectory(prefix="fw-bench-") as tmp:
            for job in jobs:
                monitor.job(job["name"])
                part = Path(tmp) / f"{job['name']}.json"
                record = run_job(job, part, len(records) + 1, len(jobs))
                result = json.loads(part.read_text()) if part.exists() else None
                records.append(record)
                parts += [result] if result is not None else []
    except _Stopped as err:
        stopped_by = signal.Signals(err.args[0]).name
        left = jobs[len(records):]  # the one it stopped, then the ones it did not start
        current = left[0]["name"] if left else "the last job's clean-up"
        records += [{"name": j["name"], "cmd": j["cmd"], "wall_s": 0.0,
                     "status": "not run (fw bench was stopped)" if i else f"stopped by {stopped_by}"}
                    for i, j in enumerate(left)]  # fmt: skip
        notes.append(f"stopped by {stopped_by} during {current}: the report holds the jobs before it")
        sys.stderr.write(f"fw bench: stopped by {stopped_by} during {current}; writing the report of the jobs before it\n")
    from framework.bench.report import write_report

    try:  # after a stop the signals stay ignored until the report is written
        if stopped_by is None:
            _restore(before)
        write_report(parts, records, args, notes, time.perf_counter() - start, monitor.stop())
    finally:
        _restore(before)
    if stopped_by is not None:
        return 128 + signal.Signals[stopped_by]
    return 0 if all(r["status"] == "ok" for r in records) else 1


class _Stopped(BaseException):
    """fw bench received SIGTERM or SIGINT (args: the signal)."""


def _restore(handlers: dict) -> None:
    for sig, handler in handlers.items():
        signal.signal(sig, handler)


def _stop(signum: int, frame: FrameType | None) -> None:
    # a second signal must not cut the killing of the job's processes or the report short
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    raise _Stopped(signum)


def _check_recipes() -> None:
    from framework.bench.workload import WORKLOADS, recipe_dir
    from framework.errors import ConfigError

    missing = [name for name in WORKLOADS if not (recipe_dir() / f"{name}.yaml").is_file()]
    if missing:
        raise ConfigError(f"no workload recipe {', '.join(f'{m}.yaml' for m in missing)} in {recipe_dir()} (fw bench --suite train/knobs); "
                          "run from a source checkout of fw (conf/bench/) or set FW_BENCH_CONF to a folder with them")


def _as_worker(args: argparse.Namespace, suites: list[str]) -> int:
    """Under mpiexec, srun or torchrun: this process is one rank of the only job."""
    from framework.bench.context import start_job
    from framework.bench.load import LoadMonitor, job_cpu_s, job_cpus, process_cpu_s
    from framework.bench.worker import run_suites

    start = time.perf_counter()
    job = start_job()
    cpus, cpu_start = job_cpus(job), process_cpu_s()  # the ranks are not rank 0's children: they count their own
    monitor = LoadMonitor(own=None, cpus=cpus).start(settle_s=0) if job.rank == 0 else None
    if monitor is not None:
        monitor.job(job.name)
    try:
        part = run_suites(job, suites, args.quick)
        own_s = job_cpu_s(job, cpu_start)
    except BaseException as err:
        if job.mpi is not None and job.world > 1:  # the other ranks would wait in MPI forever
            from framework.strategies.mpi import abort_mpi_job

            abort_mpi_job(err)
        raise
    if job.rank == 0:
        from framework.bench.report import write_report

        record = {"name": job.name, "cmd": sys.argv, "status": "ok", "wall_s": time.perf_counter() - start}
        assert monitor is not None, "rank 0 watches the load"
        write_report([part], [record], args, [f"run under {part['launcher']}: one job of {job.world} processes"],
                     time.perf_counter() - start, monitor.stop(own_s=own_s))
    job.close()
    return 0
