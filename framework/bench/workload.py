"""A ``fw bench`` training workload: its recipe (``conf/bench/<name>.yaml``), the module and data it
builds (same seed on every side, so the same weights and data), how many steps a run takes, and
the clock every side reads (``StepTimeBreakdown`` plus the run's peak memory)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import torch

from framework.bench.context import Job
from framework.callbacks.step_breakdown import StepTimeBreakdown

WORKLOADS = ("digits_mlp", "cnn", "gpt")
KNOB_WORKLOADS = ("cnn", "gpt")
#: --quick tries the DDP settings on the GPT alone (its recommendation is the one the quick run says)
QUICK_KNOB_WORKLOADS = ("gpt",)
#: the workloads trained under fsdp too, and the block classes each shards as units (besides the root)
FSDP_UNITS = {"gpt": ("_TransformerBlock",)}
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
#: the precisions the bench trains in (Lightning's names, which fw takes too)
Precision = Literal["32-true", "bf16-mixed"]


class Steps:
    """Warm-up and timed steps of a run, and the repeats of each measurement."""

    def __init__(self, quick: bool) -> None:
        self.warmup, self.timed, self.repeats = (1, 4, 1) if quick else (5, 40, 3)
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


class Clock(StepTimeBreakdown):
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
