"""The three PNGs of ``fw bench`` (matplotlib, imported only here): bus bandwidth against size,
samples/s against processes, and where fw's step time goes (shares of the step, a panel per
workload)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from framework.bench.labels import PART_LABELS
from framework.bench.results import step_shares

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def plots(stem: Path, train: list[dict], comm: list[tuple[str, dict]], footer: str | None = None) -> list[str]:
    """Write the plots next to ``stem``; their file names. ``footer``: a line at each figure's foot
    (the docs' copies name the run they were drawn from: benchmarks/plot_results.py)."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display: before pyplot is first imported
    written = []
    if comm:
        written.append(_save(_comm_figure(comm), stem, "comm", footer))
    fw_train = [r for r in train if r["side"] == "fw" and r["precision"] == "32-true" and r["device"] == "cpu"]
    workloads = sorted({r["workload"] for r in fw_train})
    if workloads:
        written.append(_save(_train_figure(train, workloads), stem, "train", footer))
        written.append(_save(_breakdown_figure(fw_train), stem, "breakdown", footer))
    return written


def _comm_figure(comm: list[tuple[str, dict]]) -> Figure:
    """Bus bandwidth against size, one panel per collective, a line per backend and job."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 8), sharex=True)
    for ax, op in zip(axes.flat, ("all_reduce", "broadcast", "all_gather", "reduce_scatter"), strict=False):
        for job, result in comm:
            for backend in result["backends"]:
                pts = sorted((r["bytes"], r["busbw_GBps"]) for r in result["collectives"] if r["op"] == op and r["backend"] == backend)
                if pts:
                    ax.plot(*zip(*pts, strict=True), marker="o", label=f"{backend} ({job})")
            ceiling = result["memcpy"].get("cpu") or next(iter(result["memcpy"].values()))
            ax.plot([r["bytes"] for r in ceiling], [r["algbw_GBps"] for r in ceiling], "k--", lw=1, label=f"memcpy ({job})")
        ax.set(xscale="log", yscale="log", title=op, xlabel="size (bytes)", ylabel="bus bandwidth (GB/s)")
        ax.grid(True, which="both", alpha=0.3)
    axes.flat[0].legend(fontsize=7)
    return fig


def _train_figure(train: list[dict], workloads: list[str]) -> Figure:
    """Samples/s against processes (CPU, 32-bit), one panel per workload, fw beside the raw loop."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(workloads), figsize=(4.5 * len(workloads), 3.8), squeeze=False)
    for ax, workload in zip(axes[0], workloads, strict=False):
        rows = [r for r in train if r["workload"] == workload and r["precision"] == "32-true" and r["device"] == "cpu"]
        single = {r["side"]: r["samples_per_s"] for r in rows if r["strategy"] == "single"}
        worlds = sorted({r["world_size"] for r in rows})
        if "fw" in single:  # on a CPU the processes share the cores one process had: the bar to beat
            ax.axhline(single["fw"], color="k", ls="--", lw=1, label="fw, one process (all cores)")
        for strategy in sorted({r["strategy"] for r in rows} - {"single"}):
            for side, style in (("fw", "-o"), ("raw", ":x")):
                pts = sorted((r["world_size"], r["samples_per_s"]) for r in rows if r["strategy"] == strategy and r["side"] == side)
                if pts:
                    start = [(1, single[side])] if side in single else []
                    ax.plot(*zip(*(start + pts), strict=True), style, label=f"{strategy} {side}")
        ax.set(title=workload, xlabel="processes", ylabel="samples/s", xticks=worlds, ylim=(0, None))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    return fig


def _breakdown_figure(fw_train: list[dict]) -> Figure:
    """fw's step split into its parts as shares of the step, one panel per workload, a stacked
    bar per strategy and world size with its step time above it: a 1 ms step's parts read as
    well as a 275 ms one's (on one axis of milliseconds they would not show)."""
    import matplotlib.pyplot as plt

    workloads = sorted({r["workload"] for r in fw_train})
    fig, axes = plt.subplots(1, len(workloads), figsize=(max(6, 0.9 * len(fw_train) + 1.5 * len(workloads)), 4),
                             squeeze=False, sharey=True)  # fmt: skip
    for ax, workload in zip(axes[0], workloads, strict=True):
        rows = sorted((r for r in fw_train if r["workload"] == workload), key=lambda r: (r["world_size"], r["strategy"]))
        labels = [f"{r['strategy']}\nx{r['world_size']}" for r in rows]
        shares = [step_shares(r) for r in rows]
        bottom = [0.0] * len(rows)
        for part, label in PART_LABELS.items():
            values = [s[part] * 100 for s in shares]
            ax.bar(labels, values, bottom=bottom, label=label)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        for x, r in enumerate(rows):
            ax.text(x, 101, f"{r['step_s'] * 1e3:.3g} ms", ha="center", va="bottom", fontsize=7)
        ax.set(title=workload, ylim=(0, 110))
        ax.tick_params(axis="x", labelsize=7)
    axes[0][0].set_ylabel("share of the step (%, medians)")
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1))
    fig.suptitle("fw: where the step time goes (step time above each bar)", fontsize=10)
    return fig


def _save(fig: Figure, stem: Path, what: str, footer: str | None = None) -> str:
    path = stem.parent / f"{stem.name}-{what}.png"
    if footer:
        fig.text(0.99, 0.01, footer, ha="right", va="bottom", fontsize=6, color="0.4")
        fig.tight_layout(rect=(0, 0.03, 1, 1))
    else:
        fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path.name
