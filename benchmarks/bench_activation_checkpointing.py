"""What activation checkpointing saves and costs: a GPT trained through ``trainer.fit`` with and
without ``activation_checkpointing_policy={_TransformerBlock}``, each in a fresh process.

Why: the activation-checkpointing guide quotes these figures; they say whether the memory a
policy saves is worth its step time on a given model.
Read: "kept for backward" and the forward's peak should fall under checkpointing and the step
time rise (the forward runs twice); "weights bit-identical" must say yes.
Time: about a minute on 2 cores; ``--dim 128 --layers 2 --heads 4 --steps 3`` a few seconds.
Run: ``python benchmarks/run.py activation_checkpointing [--steps 3]``.

The GPT is ``recipes.bench.TinyGPT`` (default: vocab 8192, context 256, width 384, 6 blocks of 6
heads, batch 16: activations much larger than the model, as in training at length). Per side:
the bytes the forward keeps for the backward (``saved_tensors_hooks`` around the step: under
checkpointing a block keeps only its input), glibc's bytes in use at the end of the forward (the
activation peak: ``mallinfo2``, beside the same reading before the step), the peak resident memory
(``ru_maxrss``), and the median step time; the weights after the fit are compared bit for bit. ::

    .venv/bin/python benchmarks/bench_activation_checkpointing.py           # about a minute on 2 CPU cores
    .venv/bin/python benchmarks/bench_activation_checkpointing.py --dim 128 --layers 2 --heads 4 --steps 3   # a quick look

Results: a table, and JSON under ``benchmarks/results/`` (``--out``).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import framework as fw  # noqa: E402


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def _in_use_mb() -> float:
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _Mallinfo2
    m = libc.mallinfo2()
    return (m.uordblks + m.hblkhd) / 2**20


def side(args: argparse.Namespace) -> dict:
    """One fit in this process; what it measured."""
    import io
    from contextlib import redirect_stderr

    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from recipes.bench import TinyGPT

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = TinyGPT(vocab=args.vocab, context=args.context, dim=args.dim, layers=args.layers, heads=args.heads)
    n = args.steps * args.batch
    tokens = torch.randint(0, args.vocab, (n, args.context + 1), generator=torch.Generator().manual_seed(1))
    loader = DataLoader(TensorDataset(tokens[:, :-1], tokens[:, 1:]), batch_size=args.batch)
    probe = _Probe()
    step = model.training_step

    def measured_step(batch, batch_idx):
        with torch.autograd.graph.saved_tensors_hooks(probe.keep, lambda t: t):
            loss = step(batch, batch_idx)
        probe.forward_done()
        return loss

    model.training_step = measured_step
    policy = {"_TransformerBlock"} if args.checkpointing else None
    trainer = fw.Trainer(accelerator="cpu", devices=1, max_steps=args.steps, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[probe],
                         activation_checkpointing_policy=policy)
    with redirect_stderr(io.StringIO()):
        trainer.fit(model, loader)
    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    torch.save(weights, args.weights)
    return {"checkpointing": args.checkpointing, "saved_MB": max(probe.saved) / 2**20,
            "activation_peak_MB": max(probe.peaks), "max_rss_MB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "step_s": sorted(probe.times)[len(probe.times) // 2], "parameters": int(weights.numel())}


class _Probe(fw.Callback):
    """Per training step: bytes kept for backward, glibc in use at the forward's end over the
    step's start, and the step's wall time (the first step is warm-up and not counted)."""

    def __init__(self) -> None:
        self.saved: list[int] = []
        self.peaks: list[float] = []
        self.times: list[float] = []
        self._saved, self._start_mb, self._start_s = 0, 0.0, 0.0

    def keep(self, tensor):
        self._saved += tensor.numel() * tensor.element_size()
        return tensor

    def forward_done(self) -> None:
        self.saved.append(self._saved)
        self.peaks.append(_in_use_mb() - self._start_mb)

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        self._saved, self._start_mb, self._start_s = 0, _in_use_mb(), time.perf_counter()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        if batch_idx:
            self.times.append(time.perf_counter() - self._start_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--side", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--checkpointing", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--weights", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        print(json.dumps(side(args)))
        return
    rows, weights = [], []
    for checkpointing in (False, True):
        path = Path(args.out) / f".ac-weights-{int(checkpointing)}.pt"
        Path(args.out).mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, __file__, "--side", "--weights", str(path),
               *[f"--{k}={getattr(args, k)}" for k in ("vocab", "context", "dim", "layers", "heads", "batch", "steps",
                                                      "threads")]]
        out = subprocess.run(cmd + (["--checkpointing"] if checkpointing else []), capture_output=True, text=True,
                             cwd=ROOT)
        if out.returncode:
            sys.exit(f"the {'with' if checkpointing else 'without'} side failed:\n{out.stderr[-3000:]}")
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        weights.append(path)
    import torch

    from framework.bench.common import machine_info, print_table, result_path, write_json

    same = bool(torch.equal(torch.load(weights[0]), torch.load(weights[1])))
    for path in weights:
        path.unlink()
    plain, ac = rows
    print_table(f"activation checkpointing, TinyGPT {plain['parameters'] / 1e6:.1f} M parameters, batch {args.batch} x "
                f"{args.context} tokens, {args.steps} steps (weights bit-identical: {same})",
                ["side", "kept for backward MB", "in use at forward end MB", "peak RSS MB", "step s"],
                [["without" if not r["checkpointing"] else "with", f"{r['saved_MB']:.1f}", f"{r['activation_peak_MB']:.1f}",
                  f"{r['max_rss_MB']:.0f}", f"{r['step_s']:.3f}"] for r in rows])
    print(f"kept for backward: {plain['saved_MB'] / ac['saved_MB']:.1f}x less; step time x{ac['step_s'] / plain['step_s']:.2f}")
    doc = {"machine": machine_info(), "args": vars(args), "rows": rows, "weights_identical": same}
    print(f"wrote {write_json(result_path('activation_checkpointing', out=Path(args.out)), doc)}")


if __name__ == "__main__":
    main()
