"""All-reduce latency over Gloo, raw mpi4py and the fw_mpi ProcessGroup (2+ ranks, CPU).

Run under MPI (the MPI launch also provides Gloo's rendezvous, so no address is needed)::

    .venv/bin/mpiexec -n 2 .venv/bin/python -m mpi4py benchmarks/bench_allreduce.py --out benchmarks/results

For each size, every rank times each op after an MPI barrier; the time of an op is the slowest
rank's, and the reported figure is the median over the iterations after warm-up. Results go
to ``<out>/allreduce-<date>-<cpu tag>.json`` and a table on rank 0.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import re
import socket
import statistics
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI

from framework.strategies.mpi_backend import mpi_library_version, register_mpi_backend

SIZES = {"1KB": 1 << 10, "64KB": 1 << 16, "1MB": 1 << 20, "16MB": 1 << 24, "64MB": 1 << 26}
ITERS = {"1KB": 1000, "64KB": 500, "1MB": 200, "16MB": 30, "64MB": 10}  # timed, after WARMUP
WARMUP = 3


def cpu_tag() -> str:
    model = platform.processor() or ""
    try:
        model = next(line.split(":", 1)[1] for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    slug = re.sub(r"[^a-z0-9]+", "-", model.lower()).strip("-") or platform.machine()
    return f"{slug}-{torch.multiprocessing.cpu_count()}c"


def init_groups(comm) -> dist.ProcessGroup:
    """Default group: Gloo (port picked by rank 0, sent over MPI); returns a fw_mpi group."""
    port = None
    if comm.rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = comm.bcast(port, root=0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=comm.rank, world_size=comm.size)
    return dist.new_group(backend=register_mpi_backend())


def time_op(comm, op, iters: int) -> float:
    """Median over iterations of the slowest rank's time for ``op()``, in seconds."""
    for _ in range(WARMUP):
        op()
    times = np.empty(iters)
    for i in range(iters):
        comm.Barrier()
        start = time.perf_counter()
        op()
        times[i] = time.perf_counter() - start
    comm.Allreduce(MPI.IN_PLACE, times, op=MPI.MAX)
    return statistics.median(times.tolist())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()
    torch.set_num_threads(1)  # launchers leave one thread per rank anyway; make it explicit
    comm = MPI.COMM_WORLD
    mpi_group = init_groups(comm)
    gloo_group = dist.group.WORLD

    rows = []
    for label, nbytes in SIZES.items():
        n = nbytes // 4
        t = torch.ones(n, dtype=torch.float32)
        a = np.ones(n, dtype=np.float32)
        timings = {
            "gloo": time_op(comm, lambda: dist.all_reduce(t, group=gloo_group), ITERS[label]),
            "mpi4py": time_op(comm, lambda: comm.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM), ITERS[label]),
            "fw_mpi": time_op(comm, lambda: dist.all_reduce(t, group=mpi_group), ITERS[label]),
        }
        rows.append({"size": label, "bytes": nbytes, "iters": ITERS[label], **{f"{k}_s": v for k, v in timings.items()}})

    if comm.rank == 0:
        today = datetime.date.today().isoformat()
        result = {
            "benchmark": "allreduce", "date": today, "hostname": socket.gethostname(), "cpu": cpu_tag(),
            "world_size": comm.size, "dtype": "float32", "torch": torch.__version__,
            "mpi4py": __import__("mpi4py").__version__, "mpi_library": mpi_library_version(),
            "statistic": "median over iterations of the slowest rank, after warm-up", "results": rows,
        }  # fmt: skip
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"allreduce-{today}-{cpu_tag()}.json"
        path.write_text(json.dumps(result, indent=2) + "\n")
        print_table(result, path)
    dist.destroy_process_group()


def print_table(result: dict, path: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    def fmt(s: float) -> str:
        return f"{s * 1e6:.0f} µs" if s < 1e-3 else f"{s * 1e3:.2f} ms"

    table = Table(title=f"all-reduce, {result['world_size']} ranks, {result['cpu']}, {result['mpi_library']}")
    for col in ("size", "Gloo", "mpi4py (raw)", "fw_mpi ProcessGroup", "fw_mpi GB/s"):
        table.add_column(col, justify="right")
    for r in result["results"]:
        table.add_row(r["size"], fmt(r["gloo_s"]), fmt(r["mpi4py_s"]), fmt(r["fw_mpi_s"]), f"{r['bytes'] / r['fw_mpi_s'] / 1e9:.2f}")
    Console().print(table)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
