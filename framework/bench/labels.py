"""How ``fw bench``'s report names things: the parts of a step, sizes, DDP settings, devices.
Shared by the tables, the recommendation and the plots."""

from __future__ import annotations

from typing import Any

#: the parts of a step (``framework.callbacks.step_breakdown.PARTS``), as the report shows them
PART_LABELS = {"data_wait": "data wait", "forward_backward": "fwd+bwd", "optimizer": "optimizer",
               "comm_unhidden": "comm (unhidden)", "other": "other"}  # fmt: skip
KB, MB = 1 << 10, 1 << 20


def human_size(nbytes: int) -> str:
    """``16 MB``, ``4 KB``, ``8 B``."""
    for unit, scale in (("GB", 1 << 30), ("MB", MB), ("KB", KB)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"


def size_label(nbytes: int) -> str:
    """A size as a table cell: ``16MB``."""
    return human_size(nbytes).replace(" ", "")


def knobs_label(row: dict[str, Any]) -> str:
    """A run's DDP settings: ``bucket_cap_mb=25, static_graph=True``, or ``defaults``."""
    return ", ".join(f"{k}={v}" for k, v in sorted(row["ddp_kwargs"].items())) or "defaults"


def on_device(row: dict[str, Any]) -> str:
    """`` on CUDA`` for a GPU run, nothing for a CPU one."""
    return "" if row["device"] == "cpu" else " on CUDA"
