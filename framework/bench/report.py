"""What ``fw bench`` writes and prints: one JSON with every sample, a Markdown report, PNG plots,
the tables on stdout, and a recommendation derived from this run's numbers.

Files, in ``--out`` (``<stem>`` is ``bench-<date>-<hardware>``): ``<stem>.json``, ``<stem>.md``,
``<stem>-comm.png`` (bus bandwidth against size, per collective and backend),
``<stem>-train.png`` (samples/s against world size, per workload and strategy) and
``<stem>-breakdown.png`` (where fw's step time goes, per workload and strategy).

The pieces: the rows of numbers (``results.py``), the sentences (``recommend.py``), the tables
(``tables.py``), the plots (``plots.py``) and how they name things (``labels.py``). What makes a
number untrustworthy (``trust.py``: overlapping spreads, values physics rules out; ``load.py``: a
machine too busy) is said in the report's Warnings, on stdout and as logging warnings on stderr.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from framework.bench.common import cpu_tag, gpu_tag, machine_info, today, write_json
from framework.bench.load import busy_verdict
from framework.bench.recommend import recommendation
from framework.bench.results import comm_parts, train_rows
from framework.bench.tables import Table, load_table, tables
from framework.callbacks.throughput import peak_for
from framework.rank_zero import library_logger

# peak_for was defined here before ThroughputMonitor held the GPUs' peaks: it is still importable from here
__all__ = ["SCHEMA", "markdown", "peak_for", "show", "versions", "write_report"]

#: 2: the machine's load (``load``), ``warnings``, refused values (``refused``, ``untrusted``)
SCHEMA = 2
log = logging.getLogger("framework.bench")


def versions() -> dict[str, Any]:
    """The versions of what ran the bench: Python, torch, fw, Lightning, mpi4py, the MPI library, CUDA."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    import torch

    import framework

    out: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "fw": getattr(framework, "__version__", "?")}  # fmt: skip
    for name in ("pytorch_lightning", "mpi4py", "numpy"):  # the installed versions, without importing (Lightning: ~10 s)
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    from framework.strategies.mpi.backend import mpi_library_version

    out["mpi_library"] = mpi_library_version()
    if torch.cuda.is_available():
        out["cuda"] = torch.version.cuda
        out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    return out


def markdown(doc: dict, tabs: list[Table]) -> str:
    m = doc["machine"]
    lines = [f"# fw bench, {m['hardware']}, {m['date']}", "",
             f"{m['cpu_count']} cores, torch {doc['versions']['torch']}, MPI: {doc['versions'].get('mpi_library') or 'none'}, "
             f"Lightning: {doc['versions'].get('pytorch_lightning') or 'not installed'}; "
             f"{'quick' if doc['quick'] else 'full'} run, {doc['wall_s']:.0f} s. Medians after warm-up; spread: min-max over "
             "repeats (training), IQR over iterations (collectives).", ""]  # fmt: skip
    if doc["warnings"]:
        lines += ["## Warnings", "", *[f"- {w}" for w in doc["warnings"]], ""]
    lines += ["## Recommendation", "", *[f"- {line}" for line in doc["recommendation"]], ""]
    for note in doc["notes"]:
        lines.append(f"> {note}\n")
    for title, columns, rows in tabs:
        lines += [f"## {title}", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        lines.append("")
    lines += ["## Jobs", "", "| job | status | wall s |", "|---|---|---|"]
    lines += [f"| {r['name']} | {r['status']} | {r['wall_s']:.1f} |" for r in doc["jobs"]]
    if doc.get("plots"):
        lines += ["", "## Plots", "", *[f"![{p}]({p})" for p in doc["plots"]]]
    return "\n".join(lines) + "\n"


# -- the whole report -------------------------------------------------------------------------
def write_report(parts: list[dict], records: list[dict], args: argparse.Namespace, notes: list[str], wall_s: float,
                 load: dict | None = None) -> Path:
    """Write the report of ``parts`` (``load``: ``LoadMonitor.stop()``'s summary) and show it."""
    import torch

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    hw = gpu_tag() if device == "cuda" else cpu_tag()
    stem = out / f"bench-{today()}-{hw}"
    train, knobs, comm = train_rows(parts), train_rows(parts, "knobs"), comm_parts(parts)
    for note in (f"Lightning: {p['train']['lightning']}" for p in parts if p.get("train") and p["train"]["lightning"] != "ran"):
        if note not in notes:
            notes.append(note)
    busy = busy_verdict(load) if load else []
    warnings = busy + [u for r in train for u in r.get("untrusted", [])]
    library_logger()  # fw's one stderr handler, set up before the first line
    for warning in warnings:
        log.warning(f"fw bench: warning: {warning}")
    doc = {
        "schema": SCHEMA, "benchmark": "fw bench", "quick": bool(args.quick), "suite": args.suite,
        "machine": machine_info(device), "versions": versions(), "wall_s": wall_s, "jobs": records,
        "notes": notes, "load": load, "warnings": warnings, "recommendation": recommendation(train, knobs, comm, busy),
        "train": train, "knobs": knobs, "parts": parts,
    }  # fmt: skip
    tabs = [*tables(train, knobs, comm), *([load_table(load)] if load else [])]
    try:
        from framework.bench.plots import plots

        doc["plots"] = plots(stem, train, comm)
    except ImportError as err:
        doc["plots"] = []
        notes.append(f"no plots: {err} (pip install 'fw[bench]')")
    json_path = write_json(stem.with_suffix(".json"), doc)
    md_path = stem.with_suffix(".md")
    md_path.write_text(markdown(doc, tabs))
    show(tabs, doc, [json_path, md_path, *(out / p for p in doc["plots"])])
    return json_path


def show(tabs: list[Table], doc: dict, files: list[Path]) -> None:
    """The tables, the files and the recommendation, on stdout."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(170, Console().width))
    for title, columns, rows in tabs:
        table = Table(title=title)
        for i, col in enumerate(columns):
            table.add_column(col, justify="left" if i < 2 else "right")
        for row in rows:
            table.add_row(*row)
        console.print(table)
    for note in doc["notes"]:
        console.print(f"note: {note}", markup=False)
    for warning in doc["warnings"]:
        console.print(f"warning: {warning}", markup=False, soft_wrap=True)  # one line each, for grep
    console.print("files: " + ", ".join(str(f) for f in files), markup=False)
    console.print("recommendation (from this run):")
    for line in doc["recommendation"]:
        console.print(f"  - {line}", markup=False)
