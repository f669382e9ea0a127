"""One process of a benchmark job: ``python -m framework.bench.worker --kind K --suites S --part F``.

``fw bench`` starts these through torch's elastic agent (Gloo, NCCL), ``mpiexec`` (MPI) or as a
single process; every rank runs the suites, rank 0 writes the job's results to ``--part``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from framework.bench.context import Job


def run_suites(job: Job, suites: list[str], quick: bool) -> dict:
    """Run ``suites`` (comm, train, knobs) in this job; the results, the same on every rank."""
    import torch

    import framework.bench.comm as comm
    import framework.bench.train as train
    from framework.bench.context import launched_by

    result = {"job": job.name, "kind": job.kind, "world_size": job.world, "launcher": launched_by() or "fw bench",
              "threads_per_process": torch.get_num_threads(), "device": str(job.device)}  # fmt: skip
    start = time.perf_counter()
    for suite in suites:
        if suite == "comm" and job.world > 1:
            result["comm"] = comm.run(job, quick)
        elif suite == "train":
            result["train"] = train.run(job, quick)
        elif suite == "knobs" and job.world > 1:
            result["knobs"] = train.run_knobs(job, quick)
    result["wall_s"] = time.perf_counter() - start
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m framework.bench.worker")
    parser.add_argument("--kind", choices=("single", "gloo", "mpi", "nccl"), required=True)
    parser.add_argument("--suites", default="comm,train,knobs")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--part", type=Path, required=True, help="where rank 0 writes the job's JSON")
    args = parser.parse_args(argv)
    from framework.bench.context import start_job

    job = start_job(args.kind)
    result = run_suites(job, args.suites.split(","), args.quick)
    if job.rank == 0:
        args.part.parent.mkdir(parents=True, exist_ok=True)
        args.part.write_text(json.dumps(result) + "\n")
    job.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
