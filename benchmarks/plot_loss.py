"""The loss curves of a run from its CSV log: ``train/loss`` per logged step and ``val/loss`` at
each validation, as one PNG. ::

    .venv/bin/python benchmarks/plot_loss.py runs/gpt/fw_logs/version_0/metrics.csv loss.png

docs/images/gpt_loss.png is this script on the log kept in benchmarks/results/::

    .venv/bin/python benchmarks/plot_loss.py benchmarks/results/gpt_cpu_metrics-2026-12-02-amd-epyc-2c.csv docs/images/gpt_loss.png
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("metrics", type=Path, help="a CSVLogger's metrics.csv")
    parser.add_argument("out", type=Path, help="the PNG to write")
    parser.add_argument("--title", default="byte-level GPT on the Python standard library (conf/gpt/cpu.yaml)")
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(csv.DictReader(args.metrics.open()))
    fig, ax = plt.subplots(figsize=(7, 4))
    for key, style in (("train/loss", "-"), ("val/loss", "o-")):
        points = [(int(r["step"]), float(r[key])) for r in rows if r.get(key)]
        if points:
            ax.plot(*zip(*points, strict=True), style, label=key, markersize=4)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("cross-entropy (nats per byte)")
    ax.set_title(args.title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
