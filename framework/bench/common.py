"""Small helpers shared by ``fw bench`` and the scripts in ``benchmarks/``: hardware tag,
result paths, statistics, tables.

Result files are named ``<benchmark>-<YYYY-MM-DD>-<hardware tag>.json`` so that runs on other
days or machines never overwrite each other. The hardware tag is the CPU model slug and core
count (``amd-epyc-2c``) or the GPU name slug (``nvidia-h200``) for GPU benchmarks.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import socket
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

#: the results folder of a source checkout (the scripts in benchmarks/ write there by default)
RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def cpu_tag() -> str:
    """``amd-epyc-2c``: CPU model slug and the number of cores this process may use."""
    model = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1] for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{_slug(model) or platform.machine()}-{torch.multiprocessing.cpu_count()}c"


def gpu_tag() -> str:
    """``nvidia-h200`` (first visible GPU), or the CPU tag when there is none."""
    if torch.cuda.is_available():
        return _slug(torch.cuda.get_device_name(0))
    return cpu_tag()


def hw_tag(device: str = "cpu") -> str:
    return gpu_tag() if device.startswith("cuda") else cpu_tag()


def today() -> str:
    return datetime.date.today().isoformat()


def result_path(name: str, device: str = "cpu", out: Path | None = None) -> Path:
    """A new file for one run's results: ``name-DATE-HARDWARE.json``, then ``...-2.json``, ...
    for later runs that day (a trial run never overwrites a result kept before it)."""
    out = Path(out) if out is not None else RESULTS
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{name}-{today()}-{hw_tag(device)}"
    path, n = out / f"{stem}.json", 1
    while path.exists():
        n += 1
        path = out / f"{stem}-{n}.json"
    return path


def machine_info(device: str = "cpu") -> dict[str, Any]:
    info = {
        "date": today(),
        "hostname": socket.gethostname(),
        "hardware": hw_tag(device),
        "cpu": cpu_tag(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["cuda"] = torch.version.cuda
    return info


def write_json(path: Path, result: dict) -> Path:
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path


def median(values: Iterable[float]) -> float:
    return statistics.median(list(values))


def iqr(values: Iterable[float]) -> tuple[float, float]:
    """(25th, 75th) percentile, for a sense of the spread around the median."""
    vals = sorted(values)
    if len(vals) < 4:
        return (vals[0], vals[-1])
    q = statistics.quantiles(vals, n=4)
    return (q[0], q[2])


def fmt_time(seconds: float) -> str:
    if seconds != seconds:  # nan
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds:.2f} s"


def print_table(title: str, columns: list[str], rows: list[list[Any]], caption: str | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, caption=caption)
    for i, col in enumerate(columns):
        table.add_column(col, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*[str(c) for c in row])
    Console(width=max(100, Console().width)).print(table)
