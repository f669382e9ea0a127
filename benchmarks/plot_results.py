"""The figures of the docs' benchmarks page (docs/benchmarks.md), from the files in benchmarks/results/.

- ``bench-train.png``, ``bench-breakdown.png``, ``bench-comm.png``: the plots of the latest ``fw bench``
  run kept in results/ (``bench-<date>-<hardware>.json``), drawn from its JSON by ``fw bench``'s own
  figure functions (``framework.bench.plots``);
- ``bench-resume.png``: the time a mid-epoch resume takes to reach its position, by position
  (``resume-*.json``, written by ``bench_resume.py``);
- ``bench-fsdp-memory.png``: model state per rank, the live bytes' peak and the peak resident memory
  of one process, DDP and FSDP on a 98 M-parameter GPT (``fsdp_memory_breakdown-*.json``, written
  by ``bench_fsdp_memory.py --breakdown``), and the peak resident memory of the same run with
  glibc's mmap threshold fixed (``fsdp_memory_breakdown-mmap1m-*.json`` of the same day);
- ``bench-checkpoint.png``: how long training waits for each kind of save under FSDP
  (``checkpoint_fsdp2-*.json``, written by ``bench_checkpoint.py``).

Each figure names in its footer the file it was drawn from, whose name carries the date and the
machine. ::

    .venv/bin/python benchmarks/plot_results.py                 # into docs/images/
    .venv/bin/python benchmarks/plot_results.py --out /tmp/figs
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
DOCS_IMAGES = HERE.parent / "docs" / "images"


def latest(pattern: str, holds=lambda doc: True) -> Path:
    """The newest file for ``pattern`` by the date in its name (a later run of a day, ``-2``, ...,
    after the first) among those whose JSON ``holds``."""
    def key(path: Path) -> tuple[str, int]:
        date = re.search(r"\d{4}-\d{2}-\d{2}", path.name)
        again = re.search(r"-(\d+)\.[a-z]+$", path.name)
        return (date.group(0) if date else "", int(again.group(1)) if again else 1)

    found = [p for p in sorted(RESULTS.glob(pattern), key=key) if holds(json.loads(p.read_text()))]
    if not found:
        raise SystemExit(f"no {pattern} in {RESULTS} to draw from")
    return found[-1]


def source_line(path: Path) -> str:
    return f"benchmarks/results/{path.name}"


def plot_bench(out: Path) -> list[Path]:
    """fw bench's three plots of its latest run kept in results/, drawn from its JSON by fw bench's
    own ``plots()``, under names that do not change from run to run, with the footer the
    other figures have (fw bench's own files name their run in the file name instead)."""
    from framework.bench.plots import plots
    from framework.bench.results import comm_parts, train_rows

    path = latest("bench-*.json")
    doc = json.loads(path.read_text())
    footer = f"fw bench, {doc['machine']['date']}, {doc['machine']['hardware']}: {source_line(path)}"
    names = plots(out / "bench", train_rows(doc["parts"]), comm_parts(doc["parts"]), footer=footer)
    return [out / name for name in names]


def plot_resume(out: Path, plt) -> Path:
    path = latest("resume-*.json")
    doc = json.loads(path.read_text())
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for side, label, style in (("fw", "fw (skips done batches by their indices)", "o-"),
                               ("draw_and_drop", "draw and drop (a loader fw cannot see into)", "s--")):
        points = sorted((int(k), v * 1e3) for k, v in doc["seconds_to_first_step"][side].items())
        ax.plot(*zip(*points, strict=True), style, label=label)
    ax.set_xlabel(f"batches done in the epoch before the checkpoint (of {doc['batches_per_epoch']})")
    ax.set_ylabel("fit() to the first step after it (ms)")
    ax.set_title(f"Resume mid-epoch: median of {doc['repeats']}; {doc['date']}, {doc['hardware']}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, out / "bench-resume.png", path)


def plot_fsdp_memory(out: Path, plt) -> Path:
    # the newest run of every configuration (a later run of some alone does not replace it), without
    # glibc's thresholds changed (the -mmap1m- file)
    path = latest("fsdp_memory_breakdown-2*.json", holds=lambda doc: {"one process", "ddp, 2 ranks"} <= set(doc["ranks"]))
    doc = json.loads(path.read_text())
    names = [n for n in ("one process", "ddp, 2 ranks", "fsdp, 2 ranks", "fsdp, 2 ranks, meta init") if n in doc["ranks"]]
    rank0 = [doc["ranks"][n][0] for n in names]
    series = [
        ("parameters + AdamW state held", [r["state_mb"] for r in rank0]),
        ("glibc's bytes in use, peak", [max(p["in_use"] for p in r["breakdown"]["phases"].values()) for r in rank0]),
        ("peak resident memory", [r["peak_mb"] for r in rank0]),
    ]
    # the same run with glibc's mmap threshold fixed at 1 MB, where one was made the same day
    fixed = RESULTS / path.name.replace("fsdp_memory_breakdown-", "fsdp_memory_breakdown-mmap1m-")
    if fixed.exists():
        runs = json.loads(fixed.read_text())["ranks"]
        series.append(("peak resident memory, MALLOC_MMAP_THRESHOLD_=1048576",
                       [runs[n][0]["peak_mb"] for n in names]))
    fig, ax = plt.subplots(figsize=(8, 4.4))
    width = 0.8 / len(series)
    for i, (label, values) in enumerate(series):
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(names))]
        bars = ax.bar(xs, values, width, label=label)
        ax.bar_label(bars, fmt="%.0f", fontsize=7)
    ax.set_xticks(range(len(names)), [n.replace(", 2 ranks", " x2") for n in names], fontsize=8)
    ax.set_ylabel("MB on rank 0")
    args = doc["args"]
    ax.set_title(f"GPT of {rank0[0]['parameters'] / 1e6:.0f} M parameters, {args['steps']} AdamW steps; "
                 f"{doc['date']}, {doc['hardware']}", fontsize=10)
    ax.set_ylim(0, max(max(v) for _, v in series) * 1.1)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2)
    return _save(fig, out / "bench-fsdp-memory.png", path, *([fixed] if fixed.exists() else []))


def plot_checkpoint(out: Path, plt) -> Path:
    path = latest("checkpoint_fsdp2-*.json")
    doc = json.loads(path.read_text())
    kinds = [(f"{kind}: the call blocks", values) for kind, values in doc["blocked_s"].items()]
    kinds.append(("sharded, async: the call to committed", doc["async_committed_s"]))
    fig, ax = plt.subplots(figsize=(7.6, 3.4))
    medians = [statistics.median(v) for _, v in kinds]
    lows = [m - min(v) for m, (_, v) in zip(medians, kinds, strict=True)]
    highs = [max(v) - m for m, (_, v) in zip(medians, kinds, strict=True)]
    bars = ax.barh(range(len(kinds)), medians, xerr=[lows, highs], capsize=3)
    ax.bar_label(bars, fmt="%.2f s", fontsize=8, padding=12)
    ax.set_yticks(range(len(kinds)), [k for k, _ in kinds], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, max(max(v) for _, v in kinds) * 1.2)
    ax.set_xlabel(f"seconds on the slowest rank (median, min-max of {doc['repeats']} saves)")
    ax.set_title(f"FSDP on 2 ranks, {doc['state_gb']:.2f} GB of model state; {doc['date']}, {doc['hardware']}",
                 fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    return _save(fig, out / "bench-checkpoint.png", path)


def _save(fig, target: Path, *sources: Path, note: str = "") -> Path:
    """Write ``fig`` with a footer naming the results files it was drawn from (after ``note``)."""
    footer = ", ".join(source_line(s) for s in sources)
    fig.text(0.99, 0.01, f"{note}: {footer}" if note else footer, ha="right", va="bottom", fontsize=6, color="0.4")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(target, dpi=110)
    fig.clf()
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DOCS_IMAGES, help="folder for the PNGs (default: docs/images)")
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    args.out.mkdir(parents=True, exist_ok=True)
    written = plot_bench(args.out)
    written += [plot(args.out, plt) for plot in (plot_resume, plot_fsdp_memory, plot_checkpoint)]
    for path in written:
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
