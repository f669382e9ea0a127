"""How busy the machine was around a ``fw bench`` run, and whether that leaves its numbers
trustworthy.

``LoadMonitor`` looks before the first job (the 1-minute load average, and the CPUs for half a
second) and then, on a light daemon thread, every ``SAMPLE_S`` seconds while the jobs run: the
load average, the share of the available cores' time that was busy (``/proc/stat``, the CPUs
in ``os.sched_getaffinity``) and how much of it was fw bench's own (the CPU time of its
process and every process below it, read from ``/proc``); the rest was other processes'. Each
sample carries the job that was running, so every job gets its own shares.

The rule (``busy_verdict``), explicit so that a report can be checked against it: the machine
was too busy to trust when

* before the run, the 1-minute load average was above the available cores
  (``BUSY_LOAD_PER_CORE`` per core), or
* during a job, other processes took more than ``OTHERS_MAX_SHARE`` of the available cores'
  time. The jobs are sized to fill the cores (one process with a thread per core, or N processes
  with cores/N threads each), so whatever else ran was load above the cores: it ran instead of
  the bench, and a speed measured then is the machine's noise as much as the code's.

The load average and ``/proc/stat`` are the whole machine's (in a container, the host's); the
cores are the ones this process may run on.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from framework.bench.context import Job

#: before the run: a 1-minute load average above this many per available core is too busy
BUSY_LOAD_PER_CORE = 1.0
#: during a job: other processes taking more than this share of the available cores' time is too busy
OTHERS_MAX_SHARE = 0.10
SAMPLE_S = 1.0
TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def available_cpus() -> list[int]:
    """The CPUs this process may run on (a container's or SLURM's share)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return list(range(os.cpu_count() or 1))


def cpu_ticks(cpus: list[int]) -> tuple[int, int] | None:
    """(busy, total) clock ticks of ``cpus`` since boot (``/proc/stat``: busy is user, nice,
    system, irq, softirq and steal; idle and iowait are not); None where it cannot be read."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return None
    wanted, busy, total = {f"cpu{c}" for c in cpus}, 0, 0
    for line in lines:
        name, *values = line.split()
        if name in wanted:
            ticks = [int(v) for v in values[:8]]  # user nice system idle iowait irq softirq steal
            total += sum(ticks)
            busy += sum(ticks) - ticks[3] - ticks[4]
    return (busy, total) if total else None


def process_cpu_s() -> float:
    """CPU seconds of this process (every thread) and of the children it reaped."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def own_cpu_s() -> float:
    """CPU seconds of this process, the children it reaped, and every live process below it.
    Each second is counted once: a reaped process's time is in its parent's cutime/cstime."""
    from framework.strategies.launchers.processes import descendants

    total = process_cpu_s()
    for pid in descendants(os.getpid()):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # it ended meanwhile
            continue
        total += sum(int(v) for v in fields[11:15]) / TICK  # utime stime cutime cstime
    return total


def shares(acc: dict[str, Any]) -> dict[str, Any]:
    """A window's totals (seconds, busy and total ticks, own CPU seconds or None) as shares of
    the available cores' time."""
    out: dict[str, Any] = {"seconds": round(acc["seconds"], 2), "busy_share": None, "own_share": None, "others_share": None}
    if acc["total"] > 0:
        out["busy_share"] = acc["busy"] / acc["total"]
        if acc["own"] is not None:
            out["own_share"] = min(1.0, acc["own"] * TICK / acc["total"])
            out["others_share"] = min(1.0, max(0.0, (acc["busy"] - acc["own"] * TICK) / acc["total"]))
    return out


class LoadMonitor:
    """The machine's load before and during a run; ``job(name)`` labels what follows.

    Args:
        interval: seconds between samples while the jobs run.
        own: the CPU seconds used so far by the bench's own processes (``own_cpu_s``), or None
            where they are not this process's descendants (under a launcher: ``stop(own_s=)``
            gives their total instead).
        cpus: the CPUs the bench may use (default: this process's).
    """

    def __init__(self, interval: float = SAMPLE_S, own: Callable[[], float] | None = own_cpu_s,
                 cpus: list[int] | None = None) -> None:
        self.cpus, self.interval, self._own = cpus or available_cpus(), interval, own
        self.samples: list[dict[str, Any]] = []
        self.acc: dict[str, dict[str, Any]] = {}
        self.label, self._t0 = "before", time.monotonic()
        self._last: tuple[float, tuple[int, int] | None, float | None] | None = None
        self.before_loadavg = list(os.getloadavg())
        self._lock, self._done = threading.Lock(), threading.Event()
        self._thread = threading.Thread(target=self._run, name="fw-bench-load", daemon=True)

    def start(self, settle_s: float = 0.5) -> LoadMonitor:
        """Look at the CPUs for ``settle_s`` before anything runs (0: no look, only the load
        average), then sample on the thread."""
        if settle_s > 0:
            self._last = self._read()
            time.sleep(settle_s)
            self.sample()
        self._thread.start()
        return self

    def job(self, name: str) -> None:
        """The samples from here on belong to job ``name``."""
        with self._lock:
            self._sample()
            self.label = name

    def sample(self) -> None:
        with self._lock:
            self._sample()

    def stop(self, own_s: float | None = None) -> dict[str, Any]:
        """End the sampling; the summary the report keeps (``own_s``: the bench's CPU seconds
        during the jobs, where ``own`` could not tell)."""
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()
        self.sample()
        jobs = {name: acc for name, acc in self.acc.items() if name != "before"}
        if own_s is not None and len(jobs) == 1:
            next(iter(jobs.values()))["own"] = own_s
        keys = ("seconds", "busy", "total")
        during = {k: sum(a[k] for a in jobs.values()) for k in keys}
        owns = [a["own"] for a in jobs.values()]
        during["own"] = None if None in owns or not owns else sum(owns)
        loads = {name: [s["loadavg"] for s in self.samples if s["job"] == name] or [os.getloadavg()[0]] for name in jobs}
        return {
            "cores": len(self.cpus), "cpus": self.cpus, "interval_s": self.interval,
            "before": {"loadavg": self.before_loadavg, **shares(self.acc.get("before", _empty()))},
            "during": {**shares(during), "loadavg_max": max((max(v) for v in loads.values()), default=os.getloadavg()[0]),
                       "loadavg_end": list(os.getloadavg())},
            "jobs": {name: {**shares(acc), "loadavg_max": max(loads[name])} for name, acc in jobs.items()},
            "samples": self.samples,
            "rule": rule(),
        }  # fmt: skip

    def _run(self) -> None:
        while not self._done.wait(self.interval):
            self.sample()

    def _read(self) -> tuple[float, tuple[int, int] | None, float | None]:
        own = self._own() if self._own is not None else None  # the slow read (all of /proc) first
        return time.monotonic(), cpu_ticks(self.cpus), own

    def _sample(self) -> None:
        now = self._read()
        (t0, ticks0, own0), (t1, ticks1, own1) = self._last or now, now
        self._last = now
        acc = self.acc.setdefault(self.label, _empty(own=self._own is not None))
        acc["seconds"] += t1 - t0
        record: dict[str, Any] = {"t": round(t1 - self._t0, 2), "job": self.label, "loadavg": round(os.getloadavg()[0], 2)}
        if ticks0 is not None and ticks1 is not None:
            window = {"seconds": t1 - t0, "busy": ticks1[0] - ticks0[0], "total": ticks1[1] - ticks0[1],
                      "own": None if own0 is None or own1 is None else own1 - own0}  # fmt: skip
            for key in ("busy", "total"):
                acc[key] += window[key]
            if acc["own"] is not None and window["own"] is not None:
                acc["own"] += window["own"]
            record.update({k: v if v is None else round(v, 3) for k, v in shares(window).items() if k != "seconds"})
        self.samples.append(record)


def job_cpus(job: Job) -> list[int]:
    """The CPUs that the job's ranks on this host may use, together (a launcher may bind each
    rank to one). A collective: every rank calls it."""
    mine = (socket.gethostname(), available_cpus())
    return sorted({c for host, cpus in job.gather(mine) if host == mine[0] for c in cpus})


def job_cpu_s(job: Job, since: float) -> float:
    """The CPU seconds the job's ranks on this host used since each read ``process_cpu_s()``
    as ``since``. A collective: every rank calls it."""
    mine = (socket.gethostname(), process_cpu_s() - since)
    return sum(s for host, s in job.gather(mine) if host == mine[0])


def _empty(own: bool = True) -> dict[str, Any]:
    return {"seconds": 0.0, "busy": 0, "total": 0, "own": 0.0 if own else None}


def rule() -> str:
    return (f"too busy to trust: a 1-minute load average above {BUSY_LOAD_PER_CORE:g} per available core before the run, "
            f"or other processes taking more than {OTHERS_MAX_SHARE:.0%} of the available cores' time during a job "
            "(the jobs are sized to fill the cores)")


def busy_verdict(load: dict[str, Any]) -> list[str]:
    """Why the machine was too busy to trust this run's numbers, by the rule of this module
    (empty: it was not). ``load`` is ``LoadMonitor.stop()``'s summary."""
    cores, out = load["cores"], []
    one_minute = load["before"]["loadavg"][0]
    if one_minute > BUSY_LOAD_PER_CORE * cores:
        out.append(f"the machine was too busy to trust before the run: 1-minute load average {one_minute:.2f} "
                   f"on {cores} available core(s) (limit {BUSY_LOAD_PER_CORE * cores:g})")
    for name, job in load["jobs"].items():
        others = job.get("others_share")
        if others is not None and others > OTHERS_MAX_SHARE:
            out.append(f"the machine was too busy to trust during {name}: other processes took {others:.0%} of the "
                       f"{cores} available core(s)' time (limit {OTHERS_MAX_SHARE:.0%}), time the bench's processes "
                       "were sized to use")
    return out
