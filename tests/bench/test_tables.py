"""fw bench's tables and breakdown plot read right: every table has one cell per column (the
collectives table had three values and two ``|`` in each backend's cell under one header), and
the breakdown shows each step's parts as shares, a panel per workload, so the parts of a 1.4 ms
step read as well as those of a 275 ms one."""

from __future__ import annotations

import pytest

from framework.bench.labels import PART_LABELS
from framework.bench.report import markdown
from framework.bench.tables import tables
from tests.bench.test_trust import rows, run

BACKENDS = ["gloo", "fw_mpi", "mpi4py"]


def comm_result() -> dict:
    cells = [{"op": op, "backend": b, "bytes": size, "median_s": 1e-4 * (i + 1), "iqr_s": [1e-4, 2e-4],
              "busbw_GBps": 0.5 + i, "fraction_of_memcpy": 0.1 * (i + 1)}
             for size in (1024, 4096) for op in ("all_reduce", "broadcast", "all_gather", "reduce_scatter")
             for i, b in enumerate(BACKENDS) if not (b == "mpi4py" and op == "broadcast")]  # fmt: skip
    ping = [{"bytes": 8, "backend": b, "latency_s": 1e-5} for b in BACKENDS]
    return {"sizes": [1024, 4096], "backends": BACKENDS, "collectives": cells, "ping_pong": ping}


def test_every_table_has_one_cell_per_column_and_the_markdown_says_so():
    train = rows(run("cnn", "single", 1, "fw", 100), run("cnn", "single", 1, "raw", 101))
    tabs = tables(train, [], [("mpi-2", comm_result())])
    collectives = next(t for t in tabs if t[0].startswith("collectives"))
    _, columns, cells = collectives
    assert columns == ["size", "op", *(f"{b} {w}" for b in BACKENDS for w in ("time", "busbw GB/s", "/memcpy"))]
    assert cells[0] == ["1KB", "all_reduce", "100.0 µs", "0.50", "0.10", "200.0 µs", "1.50", "0.20", "300.0 µs", "2.50", "0.30"]
    assert cells[1][-3:] == ["-", "-", "-"]  # broadcast: no mpi4py cell, one dash per column
    for title, columns, cells in tabs:
        assert all(len(row) == len(columns) for row in cells), title
        assert not any("|" in cell for row in cells for cell in row), title
    doc = {"machine": {"hardware": "x", "date": "d", "cpu_count": 2}, "versions": {"torch": "t"}, "quick": True,
           "wall_s": 1.0, "warnings": [], "recommendation": [], "notes": [], "jobs": []}  # fmt: skip
    md = markdown(doc, tabs)
    blocks, block = [], []
    for line in [*md.splitlines(), ""]:
        if line.startswith("|"):
            block.append(line.count("|"))
        elif block:
            blocks.append(block)
            block = []
    assert len(blocks) == len(tabs) + 1  # and the jobs table
    assert all(len(set(counts)) == 1 for counts in blocks), blocks


def test_the_breakdown_plot_shows_shares_in_a_panel_per_workload(tmp_path):
    pytest.importorskip("matplotlib")
    from framework.bench.plots import _breakdown_figure, plots

    small = run("digits_mlp", "single", 1, "fw", 64 / 0.0014)  # a 1.4 ms step
    small["parts_s"] = {"data_wait": 0.0004, "forward_backward": 0.0005, "optimizer": 0.0003, "comm_unhidden": 0.0,
                        "other": 0.0002}  # fmt: skip
    big = run("gpt", "single", 1, "fw", 64 / 0.275)  # a 275 ms step
    train = rows(small, big, run("gpt", "ddp_gloo", 2, "fw", 64 / 0.3))
    fig = _breakdown_figure(train)
    axes = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in axes] == ["digits_mlp", "gpt"]
    digits = axes[0]
    heights = [patch.get_height() for patch in digits.patches]
    assert len(heights) == len(PART_LABELS)  # one bar, a patch per part
    assert heights == pytest.approx([100 * v / 0.0014 for v in (0.0004, 0.0005, 0.0003, 0.0, 0.0002)])
    gpt_bars = [patch for patch in axes[1].patches]
    totals: dict[float, float] = {}
    for patch in gpt_bars:
        totals[patch.get_x()] = totals.get(patch.get_x(), 0) + patch.get_height()
    assert list(totals.values()) == pytest.approx([100, 100])  # every bar is the whole step
    assert {t.get_text() for t in axes[1].texts} == {"275 ms", "300 ms"} and axes[0].texts[0].get_text() == "1.4 ms"
    import matplotlib.pyplot as plt

    plt.close(fig)
    assert plots(tmp_path / "bench-x", train, []) == ["bench-x-train.png", "bench-x-breakdown.png"]
