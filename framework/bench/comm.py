"""The communication suite: collectives by size, point-to-point ping-pong, memory-copy ceiling.

For every backend the job has (``gloo``; ``fw_mpi`` and raw ``mpi4py`` in an MPI job; ``nccl``
with two or more GPUs) and every size, each collective is timed the way nccl-tests and the OSU
benchmarks do: all ranks meet at a barrier, run the operation once (the device synchronised
after it), and the time of an iteration is the slowest rank's. Warm-up iterations are dropped;
the number of timed iterations fits a time budget per cell. Sizes are the bytes of float32 data
(nccl-tests' convention): the buffer for all-reduce and broadcast, the gathered output for
all-gather, the input for reduce-scatter. Bandwidths, as nccl-tests defines them::

    algbw = size / time
    busbw = algbw * 2(n-1)/n   (all-reduce)      algbw * (n-1)/n  (all-gather, reduce-scatter)
    busbw = algbw              (broadcast)

The ceiling is a memory copy of the same size on every rank at once (``dst.copy_(src)``), timed
in the same job; each cell reports its bus bandwidth as a fraction of it. Ping-pong: rank 0 sends
to rank 1, which sends it back; latency is half the round trip, bandwidth the size over it.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from framework.bench.common import iqr, median
from framework.bench.context import Job, say
from framework.bench.labels import KB, MB, human_size

OPS = ("all_reduce", "broadcast", "all_gather", "reduce_scatter")
FULL_SIZES = [KB << (2 * i) for i in range(10)]  # 1 KB, 4 KB, ... 256 MB
QUICK_SIZES = [4 * KB, 256 * KB, 16 * MB]
PING_SIZES = [8, 4 * KB, 1 * MB]


def bus_factor(op: str, n: int) -> float:
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter"):
        return (n - 1) / n
    return 1.0


class Settings:
    def __init__(self, quick: bool) -> None:
        self.sizes = QUICK_SIZES if quick else FULL_SIZES
        self.warmup, self.min_iters, self.max_iters = (1, 3, 20) if quick else (3, 5, 300)
        self.budget_s = 0.02 if quick else 0.25


def backends(job: Job) -> dict[str, dict]:
    """name -> {group, device} (raw mpi4py: group None)."""
    found: dict[str, dict] = {"gloo": {"group": job.cpu_group, "device": torch.device("cpu")}}
    if job.mpi_group is not None:
        found["fw_mpi"] = {"group": job.mpi_group, "device": torch.device("cpu")}
        found["mpi4py"] = {"group": None, "device": torch.device("cpu")}
    if job.nccl_group is not None:
        found["nccl"] = {"group": job.nccl_group, "device": job.device}
    return found


def elements(nbytes: int, n: int) -> int:
    """float32 elements of a ``nbytes`` buffer that ``n`` ranks divide evenly (at least one each)."""
    return max(n, nbytes // 4 // n * n)


def collective(job: Job, backend: str, spec: dict, op: str, nbytes: int) -> Callable[[], None]:
    """A closure running ``op`` once on ``nbytes`` of float32 data over ``backend``."""
    n = job.world
    count = elements(nbytes, n)
    part = count // n
    if backend == "mpi4py":
        from mpi4py import MPI

        # torch's memory, as fw's side has: the allocation alone (numpy's vs torch's) moved
        # raw MPI by 12-15 % at 16-64 MB here
        comm, big_array, small_array = job.mpi, torch.zeros(count).numpy(), torch.zeros(part).numpy()
        return {
            "all_reduce": lambda: comm.Allreduce(MPI.IN_PLACE, big_array, op=MPI.SUM),
            "broadcast": lambda: comm.Bcast(big_array, root=0),
            "all_gather": lambda: comm.Allgather(small_array, big_array),
            "reduce_scatter": lambda: comm.Reduce_scatter_block(big_array, small_array, op=MPI.SUM),
        }[op]
    group, device = spec["group"], spec["device"]
    big, small = torch.zeros(count, device=device), torch.zeros(part, device=device)
    return {
        "all_reduce": lambda: dist.all_reduce(big, group=group),
        "broadcast": lambda: dist.broadcast(big, src=0, group=group),
        "all_gather": lambda: dist.all_gather_into_tensor(big, small, group=group),
        "reduce_scatter": lambda: dist.reduce_scatter_tensor(small, big, group=group),
    }[op]


def time_cell(job: Job, run: Callable[[], object], sync: Callable[[], None], s: Settings) -> list[float]:
    """The slowest rank's time of each timed iteration of ``run``, after warm-up."""
    for _ in range(s.warmup):
        job.barrier()
        run()
        sync()
    job.barrier()
    start = time.perf_counter()
    run()
    sync()
    estimate = job.agree(time.perf_counter() - start)
    iters = int(min(s.max_iters, max(s.min_iters, s.budget_s / max(estimate, 1e-9))))
    samples = []
    for _ in range(iters):
        job.barrier()
        start = time.perf_counter()
        run()
        sync()
        samples.append(time.perf_counter() - start)
    return job.max_over_ranks(samples)


def _sync_for(device: torch.device) -> Callable[[], None]:
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def _row(samples: list[float], nbytes: int, factor: float) -> dict:
    med = median(samples)
    return {"bytes": nbytes, "iters": len(samples), "median_s": med, "iqr_s": list(iqr(samples)),
            "min_s": min(samples), "max_s": max(samples), "algbw_GBps": nbytes / med / 1e9,
            "busbw_GBps": nbytes / med / 1e9 * factor, "samples_s": samples}  # fmt: skip


def memcpy(job: Job, device: torch.device, sizes: list[int], s: Settings) -> list[dict]:
    """Every rank copies ``size`` bytes at once: the memory bandwidth collectives cannot beat."""
    rows = []
    for nbytes in sizes:
        src, dst = torch.zeros(nbytes // 4, device=device), torch.empty(nbytes // 4, device=device)
        samples = time_cell(job, functools.partial(dst.copy_, src), _sync_for(device), s)
        rows.append(_row(samples, nbytes, 1.0))
    return rows


def ping_pong(job: Job, backend: str, spec: dict, nbytes: int, s: Settings) -> list[float]:
    """Round-trip times between ranks 0 and 1 (the others wait at the barrier)."""
    rank = job.rank
    if backend == "mpi4py":
        array, comm = torch.zeros(max(1, nbytes // 4)).numpy(), job.mpi
        send = lambda peer: comm.Send(array, dest=peer)  # noqa: E731
        recv = lambda peer: comm.Recv(array, source=peer)  # noqa: E731
    else:
        buf, group = torch.zeros(max(1, nbytes // 4), device=spec["device"]), spec["group"]
        send = lambda peer: dist.send(buf, dst=peer, group=group)  # noqa: E731
        recv = lambda peer: dist.recv(buf, src=peer, group=group)  # noqa: E731
    sync = _sync_for(spec["device"])

    def run() -> None:
        if rank == 0:
            send(1)
            recv(1)
        elif rank == 1:
            recv(0)
            send(0)
        sync()

    return time_cell(job, run, lambda: None, s)


def run(job: Job, quick: bool) -> dict:
    s = Settings(quick)
    found = backends(job)
    result: dict = {"world_size": job.world, "sizes": s.sizes, "backends": list(found), "collectives": [],
                    "ping_pong": [], "memcpy": {}, "statistic": "median over timed iterations of the slowest rank's "
                    "time, warm-up dropped; spread: IQR, min, max"}  # fmt: skip
    for device in sorted({str(spec["device"]) for spec in found.values()}):
        say(job, f"comm: memory-copy ceiling on {device}")
        result["memcpy"][device] = memcpy(job, torch.device(device), s.sizes, s)
    for nbytes in s.sizes:
        for op in OPS:
            for name, spec in found.items():  # the backends take turns at each size: same noise
                samples = time_cell(job, collective(job, name, spec, op, nbytes), _sync_for(spec["device"]), s)
                sent = elements(nbytes, job.world) * 4
                row = {"op": op, "backend": name, **_row(samples, sent, bus_factor(op, job.world))}
                row.update(bytes=nbytes, bytes_sent=sent)  # nominal size (the table's), and what moved
                ceiling = next(r for r in result["memcpy"][str(spec["device"])] if r["bytes"] == nbytes)
                row["fraction_of_memcpy"] = row["busbw_GBps"] / ceiling["algbw_GBps"]
                result["collectives"].append(row)
        say(job, f"comm: {human_size(nbytes)} done ({', '.join(found)})")
    for nbytes in PING_SIZES:
        for name, spec in found.items():
            samples = ping_pong(job, name, spec, nbytes, s)
            row = _row(samples, nbytes, 2.0)  # algbw: bytes over the round trip; busbw: over half of it
            row.update(backend=name, latency_s=row["median_s"] / 2, bandwidth_GBps=row["busbw_GBps"])
            result["ping_pong"].append(row)
    say(job, "comm: ping-pong done")
    return result
