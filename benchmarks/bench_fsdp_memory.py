"""Peak memory per rank of DDP and FSDP on a GPT of about 100 M parameters, on 2 ranks and on 1.

Each configuration is a fresh job (torchrun, or one process): it builds the GPT of
``recipes.bench.TinyGPT`` (vocab 8192, context 64, width 768, 12 blocks of 12 heads: 97 M
parameters), trains ``--steps`` AdamW steps through ``trainer.fit`` and reports per rank: the
bytes of parameters and AdamW moments it holds after the fit (local shards under FSDP; the
gradients are freed by ``zero_grad`` after each step, so they count in the peak only) and its
peak resident memory (``ru_maxrss``), beside the memory of the bare process before the model
(imports, the interpreter). Configurations: one process; DDP on 2; FSDP on 2 (units: the
transformer blocks); FSDP on 2 with the model built on the meta device (``trainer.init_module()``,
so no rank ever holds the whole model). On a CPU the activations and FSDP's gathered units share
the same memory as the model state; on a GPU the same split shows in ``torch.cuda.max_memory_allocated``.

Run::

    .venv/bin/python benchmarks/bench_fsdp_memory.py            # about 3 minutes on 2 CPU cores
    .venv/bin/python benchmarks/bench_fsdp_memory.py --dim 256 --layers 2   # a quick look
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = [("one process", "single", 1, False), ("ddp, 2 ranks", "ddp_gloo", 2, False),
           ("fsdp, 2 ranks", "fsdp", 2, False), ("fsdp, 2 ranks, meta init", "fsdp", 2, True)]


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def worker(args: argparse.Namespace) -> None:
    """One rank of one configuration: fit, then print this rank's figures as one JSON line."""
    sys.path.insert(0, str(ROOT))
    import torch
    from torch.utils.data import DataLoader

    import framework as fw
    from recipes.bench import SyntheticData, TinyGPT

    before = _rss_mb()
    strategy = {"name": "fsdp", "auto_wrap_policy": ["_TransformerBlock"]} if args.strategy == "fsdp" else args.strategy
    trainer = fw.Trainer(strategy=strategy, devices=args.devices, accelerator="cpu", max_steps=args.steps,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0)
    fw.seed_everything(0)
    with trainer.init_module() if args.meta else contextlib.nullcontext():
        model = TinyGPT(vocab=args.vocab, context=64, dim=args.dim, layers=args.layers, heads=args.heads)
    data = SyntheticData(kind="tokens", size=64, vocab=args.vocab, num_samples=64, batch_size=args.batch)
    data.setup("fit")
    trainer.fit(model, DataLoader(data.train_set, batch_size=args.batch))

    def local(t: torch.Tensor) -> torch.Tensor:
        return t.to_local() if hasattr(t, "to_local") else t

    params = list(model.parameters())
    state = sum(local(p).numel() * local(p).element_size() for p in params)
    state += sum(local(p.grad).numel() * local(p.grad).element_size() for p in params if p.grad is not None)
    for moments in trainer.optimizers[0].state.values():
        state += sum(local(v).numel() * local(v).element_size() for v in moments.values()
                     if isinstance(v, torch.Tensor) and v.dim() > 0)
    figures = {"rank": trainer.global_rank, "parameters": sum(p.numel() for p in params), "state_mb": state / 2**20,
               "peak_mb": _rss_mb(), "bare_mb": before}
    Path(args.out, f"rank{trainer.global_rank}.json").write_text(json.dumps(figures))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--batch", type=int, default=2, help="sequences per rank")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--worker", nargs=3, metavar=("STRATEGY", "DEVICES", "META"), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.strategy, args.devices, args.meta = args.worker[0], int(args.worker[1]), args.worker[2] == "1"
        return worker(args)
    sizes = ["--vocab", str(args.vocab), "--dim", str(args.dim), "--layers", str(args.layers), "--heads", str(args.heads),
             "--batch", str(args.batch), "--steps", str(args.steps)]
    rows, results = [], {}
    for label, strategy, devices, meta in CONFIGS:
        launch = [sys.executable] if devices == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                         f"--nproc-per-node={devices}"]
        out = tempfile.mkdtemp(prefix="fw-bench-memory-")
        cmd = [*launch, __file__, *sizes, "--worker", strategy, str(devices), "1" if meta else "0", "--out", out]
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=1800)
        ranks = [json.loads(p.read_text()) for p in sorted(Path(out).glob("rank*.json"))]
        if done.returncode != 0 or len(ranks) != devices:
            sys.exit(f"{label}: the job failed ({done.returncode}):\n{done.stderr[-3000:]}")
        results[label] = sorted(ranks, key=lambda r: r["rank"])
        worst = max(ranks, key=lambda r: r["peak_mb"])
        rows.append([label, f"{ranks[0]['parameters'] / 1e6:.0f} M", f"{max(r['state_mb'] for r in ranks):.0f} MB",
                     f"{worst['peak_mb']:.0f} MB", f"{worst['peak_mb'] - worst['bare_mb']:.0f} MB"])
    from framework.bench.common import machine_info, print_table, result_path, write_json

    print_table("model state and peak memory per rank (the rank with the higher peak)",
                ["run", "parameters", "params + AdamW state", "peak RSS", "peak - bare process"], rows,
                caption=f"{args.steps} AdamW steps, {args.batch} sequences of 64 tokens per rank")
    path = write_json(result_path("fsdp_memory"), {**machine_info(), "args": vars(args), "ranks": results})
    print(f"wrote {path}")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
