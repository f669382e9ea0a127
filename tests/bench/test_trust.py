"""fw bench does not advise from noise: the rules of ``framework/bench/trust.py`` on constructed
measurements, through the real row builder (``results.train_rows``), the recommendation and the
tables. Each case is a measurement a busy machine produced, or the boundary of a rule."""

from __future__ import annotations

import pytest

from framework.bench.recommend import recommendation
from framework.bench.results import train_rows
from framework.bench.tables import tables
from framework.bench.trust import MIN_OVER_RAW, implausible, overlaps

BATCH = 64


def run(workload: str, strategy: str, world: int, side: str, samples_per_s: float, repeat: int = 0,
        ddp_kwargs: dict | None = None) -> dict:
    """One repeat of one side, as a worker writes it: every timed step at ``samples_per_s``."""
    step = BATCH / samples_per_s
    return {"workload": workload, "strategy": strategy, "world_size": world, "side": side, "precision": "32-true",
            "ddp_kwargs": ddp_kwargs or {}, "device": "cpu", "global_batch": BATCH, "step_s": step,
            "samples_step_s": [step] * 4, "parts_s": {"data_wait": 0.0, "forward_backward": step * 0.8,
            "optimizer": step * 0.2, "comm_unhidden": 0.0, "other": 0.0, "comm_span": 0.0},
            "peak_memory_bytes": 2**20, "param_bytes_per_rank": 2**20, "call_s": 1.0, "repeat": repeat}  # fmt: skip


def rows(*runs: dict, key: str = "train") -> list[dict]:
    return train_rows([{key: {"runs": list(runs)}}], key)


def repeats(workload: str, strategy: str, world: int, side: str, *speeds: float) -> list[dict]:
    return [run(workload, strategy, world, side, s, repeat=i) for i, s in enumerate(speeds)]


def line_for(lines: list[str], workload: str) -> str:
    (line,) = [line for line in lines if line.startswith(f"{workload}:")]
    return line


def test_the_spread_rule_is_overlap_of_the_two_intervals():
    assert overlaps((1, 3), (2, 4)) and overlaps((2, 4), (1, 3)) and overlaps((1, 2), (2, 3))  # touching counts
    assert overlaps((1, 5), (2, 3)) and not overlaps((1, 2), (2.01, 3)) and not overlaps((3, 4), (1, 2))


def test_a_winner_whose_spread_overlaps_the_next_best_is_not_distinguishable():
    # a busy machine's repeats: ddp_gloo's best is faster, but its worst repeat is slower than single's best
    measured = rows(*repeats("cnn", "single", 1, "fw", 1000, 1040, 1080), *repeats("cnn", "ddp_gloo", 2, "fw", 1050, 1150, 1100),
                    *repeats("gpt", "single", 1, "fw", 200, 205, 210), *repeats("gpt", "ddp_gloo", 2, "fw", 240, 245, 250))
    lines = recommendation(measured, [], [])
    cnn = line_for(lines, "cnn")
    assert cnn.startswith("cnn: not distinguishable here: `ddp_gloo` x2 (1100, spread 1050-1150), `single` x1 (1040, spread 1000-1080)")
    assert "train with" not in cnn
    # apart: 240-250 against 200-210, so the winner is named with both spreads
    assert line_for(lines, "gpt") == ("gpt: train with `ddp_gloo` on 2 process(es) (245 samples/s; 1.20x the next best, "
                                      "`single` x1; spreads 240-250 and 200-210 apart)")


def test_every_strategy_that_overlaps_the_best_is_named_not_only_the_next():
    measured = rows(*repeats("cnn", "single", 1, "fw", 100, 120), *repeats("cnn", "ddp_gloo", 2, "fw", 110, 130),
                    *repeats("cnn", "mpi", 2, "fw", 118, 119), *repeats("cnn", "ddp_gloo", 4, "fw", 50, 60))
    cnn = line_for(recommendation(measured, [], []), "cnn")
    assert "`ddp_gloo` x2" in cnn and "`mpi` x2" in cnn and "`single` x1" in cnn and "x4" not in cnn


def test_a_scaling_above_the_world_size_is_refused_with_a_warning_and_no_recommendation():
    # the measured case: ddp_gloo x2 "scaling" 5.61 on 2 cores (the single run was slowed by others)
    measured = rows(run("digits", "single", 1, "fw", 1000), run("digits", "single", 1, "raw", 1000),
                    run("digits", "ddp_gloo", 2, "fw", 5610), run("digits", "ddp_gloo", 2, "raw", 5600))
    fw2 = next(r for r in measured if r["strategy"] == "ddp_gloo" and r["side"] == "fw")
    assert "scaling_efficiency" not in fw2 and "speedup" not in fw2
    assert fw2["refused"]["speedup"] == pytest.approx(5.61) and fw2["refused"]["scaling_efficiency"] == pytest.approx(5.61)
    assert fw2["untrusted"] == ["digits ddp_gloo x2 (fw): a speed-up of 5.61 over one process is above the world size 2, "
                                "which 2 processes each doing one process's work cannot beat: the measurement is not trustworthy"]
    line = line_for(recommendation(measured, [], []), "digits")
    assert line.startswith("digits: no recommendation, the measurements are not trustworthy: digits ddp_gloo x2 (fw): a speed-up of 5.61")
    assert line.endswith("(and 1 more)")  # the raw side's 5.60 too
    (train_table, *_) = tables(measured, [], [])
    _, columns, cells = train_table
    scaling = columns.index("scaling")
    assert [row[scaling] for row in cells if row[1] == "ddp_gloo"] == ["refused", "refused"]


def test_fw_much_faster_than_the_loop_it_wraps_is_refused():
    # the measured case: fw/raw 0.096
    measured = rows(run("cnn", "single", 1, "raw", 100), run("cnn", "single", 1, "fw", 100 / 0.096),
                    run("cnn", "single", 1, "lightning", 95))
    fw = next(r for r in measured if r["side"] == "fw")
    assert "step_over_raw" not in fw and fw["refused"] == {"step_over_raw": pytest.approx(0.096)}
    assert fw["untrusted"] == ["cnn single x1 (fw): a step 0.096x the hand-written loop's, which it wraps (below 0.8 is "
                               "implausible): the measurement is not trustworthy"]
    lightning = next(r for r in measured if r["side"] == "lightning")
    assert "untrusted" not in lightning and lightning["step_over_raw"] == pytest.approx(100 / 95)
    assert line_for(recommendation(measured, [], []), "cnn").startswith("cnn: no recommendation")
    _, columns, cells = tables(measured, [], [])[0]
    assert {row[3]: row[columns.index("/raw")] for row in cells} == {"fw": "refused", "lightning": "1.053", "raw": "-"}


@pytest.mark.parametrize(("speedup", "ratio", "refused"), [
    (2.0, MIN_OVER_RAW, set()),                       # at the limits: possible
    (2.01, 1.0, {"speedup"}), (1.5, 0.79, {"step_over_raw"}), (2.5, 0.5, {"speedup", "step_over_raw"}),
])  # fmt: skip
def test_the_physics_rules_at_their_limits(speedup, ratio, refused):
    row = {"workload": "w", "strategy": "ddp_gloo", "world_size": 2, "side": "fw", "speedup": speedup, "step_over_raw": ratio}
    assert set(implausible(row)) == refused


def test_a_ddp_setting_inside_the_defaults_spread_keeps_the_defaults():
    default, view = {"bucket_cap_mb": 25}, {"bucket_cap_mb": 25, "gradient_as_bucket_view": True}
    small = {"bucket_cap_mb": 1}
    knobs = rows(*[run("gpt", "ddp_gloo", 2, "fw", s, i, default) for i, s in enumerate((230, 240))],
                 *[run("gpt", "ddp_gloo", 2, "fw", s, i, view) for i, s in enumerate((238, 250))],
                 *[run("cnn", "ddp_gloo", 2, "fw", s, i, default) for i, s in enumerate((100, 104))],
                 *[run("cnn", "ddp_gloo", 2, "fw", s, i, small) for i, s in enumerate((120, 124))], key="knobs")
    lines = recommendation([], knobs, [])
    (gpt,) = [line for line in lines if line.startswith("DDP settings for gpt")]
    assert gpt == ("DDP settings for gpt (ddp_gloo x2): keep the defaults (the best setting, bucket_cap_mb=25, "
                   "gradient_as_bucket_view=True, is 3.8% faster, not distinguishable here: samples/s spreads 238-250 "
                   "and 230-240 overlap)")
    (cnn,) = [line for line in lines if line.startswith("DDP settings for cnn")]
    assert cnn == ("DDP settings for cnn (ddp_gloo x2): bucket_cap_mb=1 (19.6% faster than the default, samples/s "
                   "spreads 120-124 and 100-104 apart)")


def _all_reduce(backend: str, nbytes: int, median: float, low: float, high: float) -> dict:
    return {"op": "all_reduce", "backend": backend, "bytes": nbytes, "median_s": median, "iqr_s": [low, high],
            "busbw_GBps": 1.0, "fraction_of_memcpy": 0.5}


def test_all_reduce_backends_whose_iqrs_overlap_are_named_together():
    cells = [_all_reduce("gloo", 1024, 3e-4, 2e-4, 4e-4), _all_reduce("fw_mpi", 1024, 1e-5, 0.9e-5, 1.1e-5),
             _all_reduce("gloo", 4096, 3e-4, 2.5e-4, 3.5e-4), _all_reduce("fw_mpi", 4096, 2.9e-4, 2e-4, 3e-4),
             _all_reduce("mpi4py", 1024, 1e-5, 0.9e-5, 1.1e-5), _all_reduce("mpi4py", 4096, 3e-4, 2e-4, 3e-4)]
    comm = [("mpi-2", {"sizes": [1024, 4096], "collectives": cells})]
    lines = recommendation([], [], comm)
    assert "all-reduce on mpi-2: 1KB-1KB: fw_mpi; 4KB-4KB: fw_mpi or gloo (not distinguishable here)" in lines


def test_fw_mpi_implausibly_faster_than_raw_mpi4py_is_refused():
    cells = [_all_reduce("fw_mpi", 1024, 1e-5, 1e-5, 1e-5), _all_reduce("mpi4py", 1024, 2e-5, 2e-5, 2e-5)]
    comm = [("mpi-2", {"sizes": [1024], "collectives": cells})]
    assert ("fw's MPI process group all-reduce vs raw mpi4py on mpi-2: not trustworthy, 0.50x at 1KB is below 0.8 "
            "and fw's group runs mpi4py underneath") in recommendation([], [], comm)
