"""The backend comparison suite: run every benchmark, collect the results, say which to pick.

    .venv/bin/python benchmarks/run_suite.py            # CPU: ~5 minutes on 2 cores
    .venv/bin/python benchmarks/run_suite.py --quick    # smoke test, ~1 minute
    python benchmarks/run_suite.py --gpu                # add bench_gpu.py (NCCL, DP) on a GPU box
    python benchmarks/run_suite.py --only gpu           # just some parts

Each benchmark runs as a subprocess with a timeout (a hung collective cannot stall the suite);
a part that fails or times out is recorded with its error and the rest still run. Output:

* ``results/suite-<date>-<hw>.json``: every part's JSON (or error) and the recommendation rows;
* ``results/allreduce-<date>-<hw>.png``: all-reduce time against message size per backend
  (log-log), from ``bench_allreduce.py`` (and NCCL from ``bench_gpu.py`` with ``--gpu``);
* one table: each backend's training step time on this hardware, and which to pick.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from framework.bench.common import RESULTS, cpu_tag, fmt_time, gpu_tag, print_table, result_path, today, write_json  # noqa: E402

HERE = Path(__file__).resolve().parent
PY = sys.executable


def mpiexec() -> str | None:
    local = Path(PY).parent / "mpiexec"
    return str(local) if local.exists() else shutil.which("mpiexec")


def parts(quick: bool, gpu: bool, out: Path) -> dict[str, dict]:
    """name -> {cmd, timeout, json}: the subprocesses and where each writes its result."""
    q = ["--quick"] if quick else []
    o = ["--out", str(out)]
    mpi = mpiexec()
    table: dict[str, dict] = {
        "loop": {"cmd": [PY, str(HERE / "bench_loop.py"), *q, *o], "timeout": 300,
                 "json": result_path("loop", "cpu", out)},
        "ddp_gloo": {"cmd": [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                             str(HERE / "bench_ddp.py"), *q, *o], "timeout": 300,
                     "json": result_path("ddp", "cpu", out)},
    }  # fmt: skip
    if mpi:
        table["ddp_mpi"] = {"cmd": [mpi, "-n", "2", PY, "-m", "mpi4py", str(HERE / "bench_ddp.py"), "--backend", "mpi", *q, *o],
                            "timeout": 300, "json": result_path("ddp-mpi", "cpu", out)}
        table["allreduce"] = {"cmd": [mpi, "-n", "2", PY, "-m", "mpi4py", str(HERE / "bench_allreduce.py"), *o],
                              "timeout": 300, "json": out / f"allreduce-{today()}-{cpu_tag()}.json"}
    else:
        table["ddp_mpi"] = table["allreduce"] = {"skip": "no mpiexec found (pip install 'fw[mpi]')"}
    if gpu:
        table["gpu"] = {"cmd": [PY, str(HERE / "bench_gpu.py"), *q, *o], "timeout": 240,
                        "json": result_path("gpu", "cuda", out)}
    return table


def run_part(name: str, spec: dict) -> dict:
    if "skip" in spec:
        return {"status": "skipped", "reason": spec["skip"]}
    print(f"[suite] {name}: {' '.join(spec['cmd'])}", flush=True)
    start = time.perf_counter()
    try:
        proc = subprocess.run(spec["cmd"], capture_output=True, text=True, timeout=spec["timeout"])
    except subprocess.TimeoutExpired as err:
        return {"status": "timeout", "timeout_s": spec["timeout"], "stderr_tail": (err.stderr or b"")[-2000:].decode(errors="replace")
                if isinstance(err.stderr, bytes) else str(err.stderr or "")[-2000:]}  # fmt: skip
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        return {"status": "failed", "returncode": proc.returncode, "wall_s": wall,
                "stderr_tail": proc.stderr[-3000:], "stdout_tail": proc.stdout[-2000:]}  # fmt: skip
    try:
        data = json.loads(Path(spec["json"]).read_text())
    except (OSError, ValueError) as err:
        return {"status": "failed", "error": f"no result JSON at {spec['json']}: {err}", "wall_s": wall}
    data.pop("samples_step_s", None)  # keep the suite file small; the part's own file has them
    return {"status": "ok", "wall_s": wall, "file": Path(spec["json"]).name, "result": data}


def recommendations(res: dict) -> list[dict]:
    """One row per way of training this MLP here, fastest first, with a verdict."""
    rows = []
    ddp = res.get("ddp_mpi", {}).get("result") or res.get("ddp_gloo", {}).get("result")
    if ddp:
        step = ddp["step_s"]
        model = f"{ddp['model']}, {ddp['per_rank_batch']}/rank, {ddp['world_size']} ranks"
        rows.append({"backend": "Gloo (fw ddp_gloo)", "step_s": step["fw_ddp_gloo"], "what": model})
        if "fw_mpi" in step:
            rows.append({"backend": "MPI (fw mpi, mpi4py ProcessGroup)", "step_s": step["fw_mpi"], "what": model})
    gpu = res.get("gpu", {}).get("result") or {}
    st = (gpu.get("strategies") or {}).get("step_s", {})
    for key, label in (("fw_single", "one GPU (fw single)"), ("fw_ddp_nccl", "NCCL (fw ddp_nccl, 1 GPU)"), ("fw_dp", "DataParallel (fw dp, 1 GPU)")):
        if key in st:
            rows.append({"backend": label, "step_s": st[key], "what": f"{gpu['strategies']['model']}, batch {gpu['strategies']['batch']}"})
    rows.sort(key=lambda r: r["step_s"])
    for i, r in enumerate(rows):
        r["verdict"] = "pick this" if i == 0 else f"{r['step_s'] / rows[0]['step_s']:.2f}x slower"
    return rows


def allreduce_rows(res: dict) -> dict[str, list[tuple[int, float]]]:
    """backend -> [(bytes, seconds)] for the plot."""
    series: dict[str, list[tuple[int, float]]] = {}
    ar = res.get("allreduce", {}).get("result")
    if ar:
        for key, label in (("gloo_s", "Gloo (CPU)"), ("mpi4py_s", "mpi4py raw (CPU)"), ("fw_mpi_s", "fw_mpi ProcessGroup (CPU)")):
            series[label] = [(r["bytes"], r[key]) for r in ar["results"]]
    gpu = res.get("gpu", {}).get("result") or {}
    if gpu.get("nccl_allreduce"):
        series["NCCL (1 GPU, world 1)"] = [(r["bytes"], r["nccl_s"]) for r in gpu["nccl_allreduce"]]
    return series


def plot(series: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, pts in series.items():
        xs, ys = zip(*sorted(pts))
        ax.plot(xs, ys, marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes, float32)")
    ax.set_ylabel("all-reduce time (s, median, slowest rank)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="short runs (smoke test)")
    parser.add_argument("--gpu", action="store_true", help="add bench_gpu.py (needs CUDA)")
    parser.add_argument("--only", nargs="*", help="run only these parts: loop ddp_gloo ddp_mpi allreduce gpu")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    gpu = args.gpu or bool(args.only and "gpu" in args.only)
    if gpu:
        import torch

        if not torch.cuda.is_available():
            print("[suite] --gpu: CUDA is not available, skipping the GPU part")
            gpu = False
    table = parts(args.quick, gpu, args.out)
    if args.only:
        table = {k: v for k, v in table.items() if k in args.only}

    res = {name: run_part(name, spec) for name, spec in table.items()}
    hw = gpu_tag() if gpu else cpu_tag()
    rec = recommendations(res)
    suite = {"benchmark": "suite", "date": today(), "hardware": hw, "cpu": cpu_tag(), "quick": args.quick,
             "parts": res, "recommendation": rec}  # fmt: skip
    series = allreduce_rows(res)
    if series:
        png = args.out / f"allreduce-{today()}-{hw}.png"
        try:
            plot(series, png, f"all-reduce, {hw}, {today()}")
            suite["plot"] = png.name
        except Exception as err:  # noqa: BLE001 - a missing matplotlib must not lose the results
            suite["plot_error"] = f"{type(err).__name__}: {err}"
    path = write_json(args.out / f"suite-{today()}-{hw}.json", suite)
    report(res, rec, hw)
    print(f"wrote {path}" + (f" and {suite['plot']}" if "plot" in suite else ""))


def report(res: dict, rec: list[dict], hw: str) -> None:
    rows = []
    for name, r in res.items():
        detail = r.get("reason") or r.get("error") or (r.get("stderr_tail", "").strip().splitlines() or [""])[-1]
        rows.append([name, r["status"], f"{r.get('wall_s', 0):.0f} s" if "wall_s" in r else "", detail[:70] if r["status"] != "ok" else r.get("file", "")])
    print_table(f"benchmark suite, {hw}, {today()}", ["part", "status", "wall", "file / error"], rows)

    fw_rows = []
    loop = res.get("loop", {}).get("result")
    if loop:
        fw_rows.append(["one process (bench_loop)", fmt_time(loop["raw_step_s"]), fmt_time(loop["fw_step_s"]),
                        f"{loop['ratio_fw_over_raw']:.4f}", "<= 1.01"])
    for key, part in (("ddp_gloo", "ddp_gloo"), ("ddp_mpi", "ddp_mpi")):
        d = res.get(key, {}).get("result")
        if not d:
            continue
        s = d["step_s"]
        fw_rows.append([f"ddp_gloo, 2 ranks ({part} run)", fmt_time(s["raw_gloo"]), fmt_time(s["fw_ddp_gloo"]),
                        f"{s['fw_ddp_gloo'] / s['raw_gloo']:.4f}", "<= 1.02"])
        if "fw_mpi" in s:
            fw_rows.append(["mpi, 2 ranks (vs raw DDP on fw_mpi)", fmt_time(s["raw_fw_mpi"]), fmt_time(s["fw_mpi"]),
                            f"{s['fw_mpi'] / s['raw_fw_mpi']:.4f}", "<= 1.02"])
    if fw_rows:
        print_table("fw overhead against hand-written loops (median step time)", ["run", "raw", "fw", "fw/raw", "target"], fw_rows)

    if rec:
        print_table(f"which backend to pick on {hw} (training step, median)", ["backend", "step", "verdict", "workload"],
                    [[r["backend"], fmt_time(r["step_s"]), r["verdict"], r["what"]] for r in rec])
    ar = res.get("allreduce", {}).get("result")
    if ar:
        rows = []
        for r in ar["results"]:
            best = min(("Gloo", r["gloo_s"]), ("fw_mpi", r["fw_mpi_s"]), key=lambda p: p[1])
            rows.append([r["size"], fmt_time(r["gloo_s"]), fmt_time(r["fw_mpi_s"]), fmt_time(r["mpi4py_s"]), best[0]])
        print_table("all-reduce by size (2 ranks)", ["size", "Gloo", "fw_mpi", "mpi4py raw", "faster backend"], rows)


if __name__ == "__main__":
    main()
