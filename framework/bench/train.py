"""The training suite and the DDP knobs: real workloads under the job's strategy, fw beside a
hand-written PyTorch loop (and PyTorch Lightning when it is installed), in the same job.

Each run builds the workload from its recipe (``conf/bench/<name>.yaml``, same seed, so the same
weights and data), trains ``warmup + timed`` steps and reads the clock with
``StepTimeBreakdown``: fw and Lightning through their hooks, the hand-written loop by calling the
same clock at the same places (so all sides carry the same instrumentation, including the DDP
communication hook that times the gradient all-reduce). The sides take turns in every repeat.

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
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler

from framework.bench.common import iqr, median
from framework.bench.context import Job, launched_by, say
from framework.callbacks.step_breakdown import PARTS, StepTimeBreakdown

WORKLOADS = ("digits_mlp", "cnn", "gpt")
KNOB_WORKLOADS = ("cnn", "gpt")
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class Steps:
    def __init__(self, quick: bool) -> None:
        self.warmup, self.timed, self.repeats = (2, 6, 1) if quick else (5, 40, 3)
        self.knob_repeats = 1 if quick else 2

    @property
    def total(self) -> int:
        return self.warmup + self.timed


def recipe_dir() -> Path:
    """``conf/bench`` of the source tree fw runs from (or ``FW_BENCH_CONF``)."""
    if os.environ.get("FW_BENCH_CONF"):
        return Path(os.environ["FW_BENCH_CONF"])
    return Path(__file__).resolve().parents[2] / "conf" / "bench"


def load_workload(name: str) -> dict:
    from framework.config import load_recipe

    recipe, _ = load_recipe(recipe_dir() / f"{name}.yaml")
    return recipe


class _Clock(StepTimeBreakdown):
    """The breakdown plus the run's peak memory, read at the end of every step."""

    def __init__(self, device: torch.device) -> None:
        super().__init__(log=False, synchronize=device.type == "cuda")
        self.device, self.peak_bytes = device, 0
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

    def mark_batch_end(self) -> None:
        super().mark_batch_end()
        if self.device.type == "cuda":
            self.peak_bytes = torch.cuda.max_memory_allocated(self.device)
        else:
            with open("/proc/self/statm") as f:
                self.peak_bytes = max(self.peak_bytes, int(f.read().split()[1]) * PAGE)


def build(recipe: dict, job: Job, steps: int) -> tuple[Any, Any]:
    """The workload's module and data module, seeded; synthetic data sized for ``steps``."""
    from framework.config import instantiate
    from framework.seed import seed_everything

    seed_everything(recipe.get("seed") or 0)
    module = instantiate(recipe["module"], "module")
    data_spec = dict(recipe["data"])
    if "num_samples" in data_spec:
        data_spec["num_samples"] = data_spec["batch_size"] * job.world * steps
    data = instantiate(data_spec, "data")
    data.setup("fit")
    return module, data


def global_batch(data, job: Job) -> int:
    return data.batch_size * job.world


# -- the sides --------------------------------------------------------------------------------
def run_raw(job: Job, module, data, steps: int, clock: _Clock, precision: str, ddp_kwargs: dict, dp: bool) -> None:
    """The hand-written loop: DDP (or DataParallel) and a DistributedSampler as a user writes them."""
    device = job.device
    module = module.to(device)
    loader = data.train_dataloader()
    sampler = None
    if job.world > 1:
        group = job.mpi_group if job.kind == "mpi" else None
        ids = [device.index] if device.type == "cuda" else None
        model = torch.nn.parallel.DistributedDataParallel(module, device_ids=ids, process_group=group, **ddp_kwargs)
        clock.attach(model)
        sampler = DistributedSampler(loader.dataset, job.world, job.rank, shuffle=isinstance(loader.sampler, RandomSampler))
        loader = DataLoader(loader.dataset, batch_size=loader.batch_size, sampler=sampler, drop_last=loader.drop_last)
    elif dp:
        model = torch.nn.DataParallel(module)
    else:
        model = module
    optimizer = module.configure_optimizers()
    optimizer = optimizer["optimizer"] if isinstance(optimizer, dict) else optimizer
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16-mixed" else None
    model.train()
    done, epoch = 0, 0
    while done < steps:
        if sampler is not None:
            sampler.set_epoch(epoch)
        clock.mark_epoch_start()
        for x, y in loader:
            if done >= steps:
                break
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            clock.mark_batch_start()
            if autocast is not None:
                with autocast:
                    loss = module.criterion(model(x), y)
            else:
                loss = module.criterion(model(x), y)
            clock.mark_backward_start()
            loss.backward()
            clock.mark_backward_end()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            clock.mark_batch_end()
            done += 1
        epoch += 1


def fw_strategy(job: Job, ddp_kwargs: dict, dp: bool):
    if job.kind == "mpi":
        from framework.strategies import MPIStrategy

        strategy = MPIStrategy(**ddp_kwargs)
        strategy.ddp_kwargs["process_group"] = job.mpi_group  # the Gloo default group is the bench's
        return strategy
    if job.world > 1:
        return {"name": "ddp_nccl" if job.kind == "nccl" else "ddp_gloo", **ddp_kwargs}
    return "dp" if dp else "single"


def run_fw(job: Job, module, data, steps: int, clock: _Clock, precision: str, ddp_kwargs: dict, dp: bool) -> None:
    import framework as fw

    cuda = job.device.type == "cuda"
    trainer = fw.Trainer(
        accelerator="cuda" if cuda else "cpu", devices=(torch.cuda.device_count() if dp else job.local_world),
        num_nodes=max(1, job.world // max(1, job.local_world)),
        strategy=fw_strategy(job, ddp_kwargs, dp), max_steps=steps, max_epochs=-1, precision=precision,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, limit_val_batches=0, callbacks=[clock],
    )  # fmt: skip
    trainer.fit(module, datamodule=data)


def lightning_missing(job: Job, dp: bool = False) -> str | None:
    """Why Lightning cannot run in this job (None: it can)."""
    try:
        import pytorch_lightning  # noqa: F401
    except ImportError:
        return "pytorch_lightning is not installed"
    if dp:
        return "Lightning 2.x has no DataParallel strategy"
    if job.kind == "mpi":
        return "Lightning has no MPI backend without a torch built with MPI: not run under mpiexec"
    if job.world > 1 and launched_by() == "slurm":
        return "not run under srun (its SLURM environment would start its own rendezvous)"
    return None


def run_lightning(job: Job, module, data, steps: int, clock: _Clock, precision: str, ddp_kwargs: dict, dp: bool) -> None:
    import pytorch_lightning as pl

    class Workload(pl.LightningModule):
        def __init__(self, inner) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return self.inner.criterion(self(x), y)

        def configure_optimizers(self):
            return self.inner.configure_optimizers()

    class Clock(pl.Callback):
        def on_train_start(self, trainer, pl_module):
            if job.world > 1:
                clock.attach(trainer.strategy.model)

        def on_train_epoch_start(self, trainer, pl_module):
            clock.mark_epoch_start()

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            clock.mark_batch_start()

        def on_before_backward(self, trainer, pl_module, loss):
            clock.mark_backward_start()

        def on_after_backward(self, trainer, pl_module):
            clock.mark_backward_end()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            clock.mark_batch_end()

    strategy: Any = "auto"
    if job.world > 1:
        from pytorch_lightning.strategies import DDPStrategy

        strategy = DDPStrategy(process_group_backend="nccl" if job.kind == "nccl" else "gloo", **ddp_kwargs)
    elif dp:
        strategy = "dp"
    trainer = pl.Trainer(
        accelerator="gpu" if job.device.type == "cuda" else "cpu",
        devices=torch.cuda.device_count() if dp else max(1, job.local_world), num_nodes=max(1, job.world // max(1, job.local_world)),
        strategy=strategy, max_steps=steps, max_epochs=-1, precision=precision,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, limit_val_batches=0, callbacks=[Clock()], default_root_dir="/tmp/fw-bench-lightning",
    )  # fmt: skip
    trainer.fit(Workload(module), train_dataloaders=data.train_dataloader())


SIDES = {"raw": run_raw, "fw": run_fw, "lightning": run_lightning}


def measure(job: Job, workload: str, side: str, steps: Steps, precision: str = "32-true",
            ddp_kwargs: dict | None = None, dp: bool = False) -> dict:
    """One run of one side; every rank returns the same summary."""
    recipe = load_workload(workload)
    module, data = build(recipe, job, steps.total)
    clock = _Clock(job.device)
    start = time.perf_counter()
    with _captured():  # the frameworks' own chatter (run summaries, tips) would drown the progress
        SIDES[side](job, module, data, steps.total, clock, precision, dict(ddp_kwargs or {}), dp)
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
    }  # fmt: skip
    out["samples_per_s"] = out["global_batch"] / out["step_s"]
    if hasattr(module, "flops_per_token"):
        out["flops_per_sample"] = module.flops_per_token() * module.hparams["context"]
    return out


@contextlib.contextmanager
def _captured():
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
        run_raw(job, module, data, steps.warmup + 1, _Clock(job.device), "32-true", {}, False)


def _quiet() -> None:
    from framework.rank_zero import library_logger

    library_logger()  # configured now, so that the level below sticks
    for name in ("framework", "pytorch_lightning", "lightning.pytorch", "lightning.fabric", "lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")


def variants(job: Job) -> list[dict]:
    """The strategies this job trains under: its own, plus DataParallel and bf16 on GPUs."""
    out = [{"strategy": strategy_name(job)}]
    if job.kind == "single" and job.device.type == "cuda":
        out.append({"strategy": "dp", "dp": True})
        out.append({"strategy": "single", "precision": "bf16-mixed", "workloads": ("gpt",)})
    return out


def strategy_name(job: Job) -> str:
    return {"single": "single", "gloo": "ddp_gloo", "mpi": "mpi", "nccl": "ddp_nccl"}[job.kind]


def run(job: Job, quick: bool, workloads: tuple[str, ...] = WORKLOADS) -> dict:
    _quiet()
    steps = Steps(quick)
    why_no_lightning = lightning_missing(job)
    runs = []
    for variant in variants(job):
        sides = ["raw", "fw"] + ([] if lightning_missing(job, variant.get("dp", False)) else ["lightning"])
        for workload in variant.get("workloads", workloads):
            warm_up(job, workload, steps)
            for r in range(steps.repeats):
                order = sides[r % len(sides):] + sides[: r % len(sides)]
                for side in order:
                    row = measure(job, workload, side, steps, variant.get("precision", "32-true"), dp=variant.get("dp", False))
                    row.update(strategy=variant["strategy"], world_size=job.world, repeat=r, device=str(job.device))
                    runs.append(row)
            say(job, f"train: {workload} under {variant['strategy']} ({', '.join(sides)}) done")
    return {"steps": vars(steps), "lightning": why_no_lightning or "ran", "runs": runs}


def knob_configs(quick: bool) -> list[dict]:
    if quick:
        return [{"bucket_cap_mb": 25}, {"bucket_cap_mb": 1}, {"bucket_cap_mb": 25, "gradient_as_bucket_view": True},
                {"bucket_cap_mb": 25, "static_graph": True}]  # fmt: skip
    sweep = [{"bucket_cap_mb": mb} for mb in (0.25, 1, 4, 25, 100)]
    return sweep + [{"bucket_cap_mb": 25, "gradient_as_bucket_view": True}, {"bucket_cap_mb": 25, "static_graph": True},
                    {"bucket_cap_mb": 25, "gradient_as_bucket_view": True, "static_graph": True}]  # fmt: skip


def run_knobs(job: Job, quick: bool) -> dict:
    """fw under the job's DDP strategy with each DDP setting, on the CNN and the GPT."""
    _quiet()
    steps = Steps(quick)
    configs = knob_configs(quick)
    runs = []
    for workload in KNOB_WORKLOADS:
        warm_up(job, workload, steps)
        for r in range(steps.knob_repeats):
            for config in configs[r % len(configs):] + configs[: r % len(configs)]:
                row = measure(job, workload, "fw", steps, ddp_kwargs=copy.deepcopy(config))
                row.update(strategy=strategy_name(job), world_size=job.world, repeat=r)
                runs.append(row)
        say(job, f"knobs: {workload} done ({len(configs)} settings)")
    return {"configs": configs, "runs": runs}
