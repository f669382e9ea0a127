"""The training suite and the DDP knobs: real workloads under the job's strategy, fw beside a
hand-written PyTorch loop (and PyTorch Lightning when it is installed), in the same job.

Each run builds the workload from its recipe (``workload.py``: ``conf/bench/<name>.yaml``, same
seed, so the same weights and data), trains ``warmup + timed`` steps and reads the clock with
``StepTimeBreakdown``: fw and Lightning through their hooks, the hand-written loop by calling the
same clock at the same places (``sides.py``; so all sides carry the same instrumentation,
including the DDP communication hook that times the gradient all-reduce). The sides take turns
in every repeat.

Per run: the slowest rank's step time (median over the timed steps), samples/s (global batch
over that median), the parts of the step (each rank's median, averaged over the ranks), peak
memory (resident set of the process, or CUDA's peak allocation) and the wall time of the whole
call (start-up included).
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

from framework.bench.common import iqr, median
from framework.bench.context import Job, say
from framework.bench.sides import SIDES, lightning_missing, run_raw
from framework.bench.workload import (
    FSDP_UNITS,
    KNOB_WORKLOADS,
    QUICK_KNOB_WORKLOADS,
    WORKLOADS,
    Clock,
    Precision,
    Steps,
    build,
    global_batch,
    load_workload,
)
from framework.callbacks.step_breakdown import PARTS


@dataclass(frozen=True)
class Variant:
    """A strategy the training suite runs under: the job's own, fsdp beside DDP, or DataParallel or
    bf16 on a GPU."""

    strategy: str
    dp: bool = False
    precision: Precision = "32-true"
    workloads: tuple[str, ...] | None = None  # None: every workload

    def units(self, workload: str) -> tuple[str, ...]:
        """The block classes fsdp shards (empty: not sharded)."""
        return FSDP_UNITS[workload] if self.strategy == "fsdp" else ()


def measure(job: Job, workload: str, side: str, steps: Steps, precision: Precision = "32-true",
            ddp_kwargs: dict | None = None, dp: bool = False, units: tuple[str, ...] = ()) -> dict:
    """One run of one side (``units``: sharded by FSDP, these block classes as units); every rank
    returns the same summary."""
    recipe = load_workload(workload)
    module, data = build(recipe, job, steps.total)
    clock = Clock(job.device)
    start = time.perf_counter()
    sharded = {"units": units} if units else {}
    with _captured():  # the frameworks' own chatter (run summaries, tips) would drown the progress
        SIDES[side](job, module, data, steps.total, clock, precision, dict(ddp_kwargs or {}), dp, **sharded)
    call_s = time.perf_counter() - start
    mine = list(clock.steps)[steps.warmup:]
    totals = job.max_over_ranks([s["total"] for s in mine])
    parts = {p: median(s[p] for s in mine) for p in (*PARTS, "comm_span")} if mine else {}
    every = job.gather({"parts": parts, "peak_bytes": clock.peak_bytes, "call_s": call_s})
    out = {
        "workload": workload, "side": side, "precision": precision, "ddp_kwargs": ddp_kwargs or {},
        "global_batch": global_batch(data, job), "steps_timed": len(totals), "warmup_steps": steps.warmup,
        "step_s": median(totals) if totals else float("nan"), "step_iqr_s": list(iqr(totals)) if totals else [],
        "samples_step_s": totals,
        "parts_s": {p: sum(r["parts"][p] for r in every) / len(every) for p in parts},
        "peak_memory_bytes": max(r["peak_bytes"] for r in every),
        "call_s": max(r["call_s"] for r in every),
        "params": sum(p.numel() for p in module.parameters()),
        "param_bytes_per_rank": max(job.gather(_local_bytes(module))),
    }  # fmt: skip
    out["samples_per_s"] = out["global_batch"] / out["step_s"]
    if hasattr(module, "flops_per_token"):
        out["flops_per_sample"] = module.flops_per_token() * module.hparams["context"]
    return out


def _local_bytes(module) -> int:
    """The parameter bytes this rank holds (its shards under FSDP)."""
    return sum((p.to_local() if hasattr(p, "to_local") else p).nbytes for p in module.parameters())


@contextlib.contextmanager
def _captured() -> Iterator[None]:
    """stdout and stderr into a buffer, shown only if the run fails."""
    buffer = io.StringIO()
    try:
        with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
            yield
    except BaseException:
        sys.stderr.write(buffer.getvalue())
        raise


def warm_up(job: Job, workload: str, steps: Steps) -> None:
    """An unrecorded short run first: the process's one-time costs (kernels chosen for these
    shapes, allocator growth, lazy imports) must not land on whichever side runs first."""
    module, data = build(load_workload(workload), job, steps.total)
    with _captured():
        run_raw(job, module, data, steps.warmup + 1, Clock(job.device), "32-true", {}, False)


def _quiet() -> None:
    from framework.rank_zero import library_logger

    library_logger()  # configured now, so that the level below sticks
    for name in ("framework", "pytorch_lightning", "lightning.pytorch", "lightning.fabric", "lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)
    logging.getLogger("framework.bench").setLevel(logging.WARNING)  # the report's warnings (under a launcher) still show
    warnings.filterwarnings("ignore")


def variants(job: Job) -> list[Variant]:
    """The strategies this job trains under: its own, plus DataParallel and bf16 on GPUs."""
    out = [Variant(strategy_name(job))]
    if job.kind in ("gloo", "nccl") and job.world > 1:  # beside DDP on the same ranks
        out.append(Variant("fsdp", workloads=tuple(FSDP_UNITS)))
    if job.kind == "single" and job.device.type == "cuda":
        out.append(Variant("dp", dp=True))
        out.append(Variant("single", precision="bf16-mixed", workloads=("gpt", "gpt_gpu")))  # gpt_gpu: 163 M (untied head), MFU
    return out


def strategy_name(job: Job) -> str:
    return {"single": "single", "gloo": "ddp_gloo", "mpi": "mpi", "nccl": "ddp_nccl"}[job.kind]


def run(job: Job, quick: bool, workloads: tuple[str, ...] = WORKLOADS) -> dict:
    _quiet()
    steps = Steps(quick)
    why_no_lightning = lightning_missing(job)
    runs = []
    for variant in variants(job):
        sides = ["raw", "fw"] + ([] if lightning_missing(job, variant.dp) or variant.strategy == "fsdp" else ["lightning"])
        for workload in variant.workloads or workloads:
            warm_up(job, workload, steps)
            for r in range(steps.repeats):
                order = sides[r % len(sides):] + sides[: r % len(sides)]
                for side in order:
                    row = measure(job, workload, side, steps, variant.precision, dp=variant.dp,
                                  units=variant.units(workload))
                    row.update(strategy=variant.strategy, world_size=job.world, repeat=r, device=str(job.device))
                    runs.append(row)
            say(job, f"train: {workload} under {variant.strategy} ({', '.join(sides)}) done")
    return {"steps": vars(steps), "lightning": why_no_lightning or "ran", "runs": runs}


def knob_configs(quick: bool) -> list[dict]:
    if quick:
        return [{"bucket_cap_mb": 25}, {"bucket_cap_mb": 1}, {"bucket_cap_mb": 25, "gradient_as_bucket_view": True},
                {"bucket_cap_mb": 25, "static_graph": True}]  # fmt: skip
    sweep = [{"bucket_cap_mb": mb} for mb in (0.25, 1, 4, 25, 100)]
    return [*sweep, {"bucket_cap_mb": 25, "gradient_as_bucket_view": True}, {"bucket_cap_mb": 25, "static_graph": True},
            {"bucket_cap_mb": 25, "gradient_as_bucket_view": True, "static_graph": True}]  # fmt: skip


def run_knobs(job: Job, quick: bool) -> dict:
    """fw under the job's DDP strategy with each DDP setting, on the CNN and the GPT (--quick: the GPT)."""
    _quiet()
    steps = Steps(quick)
    configs = knob_configs(quick)
    runs = []
    for workload in QUICK_KNOB_WORKLOADS if quick else KNOB_WORKLOADS:
        warm_up(job, workload, steps)
        for r in range(steps.knob_repeats):
            for config in configs[r % len(configs):] + configs[: r % len(configs)]:
                row = measure(job, workload, "fw", steps, ddp_kwargs=copy.deepcopy(config))
                row.update(strategy=strategy_name(job), world_size=job.world, repeat=r)
                runs.append(row)
        say(job, f"knobs: {workload} done ({len(configs)} settings)")
    return {"configs": configs, "runs": runs}
