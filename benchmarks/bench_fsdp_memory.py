"""Peak memory per rank of DDP and FSDP on a GPT of about 100 M parameters, on 2 ranks and on 1.

Why: FSDP's promise is memory per rank; this checks what a CPU rank really holds and where
the peaks go (the benchmarks page's figure and the FSDP report come from it).
Read: model state per rank should halve from DDP to FSDP on 2 ranks; peak RSS follows only when
glibc returns what FSDP frees (``MALLOC_MMAP_THRESHOLD_``), which ``--breakdown`` shows.
Time: about 3 minutes on 2 cores; ``--dim 256 --layers 2`` under a minute.
Run: ``python benchmarks/run.py fsdp_memory [--breakdown]`` (it starts its own jobs).

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
    .venv/bin/python benchmarks/bench_fsdp_memory.py --breakdown            # where each peak goes (MemoryProbe)
    MALLOC_MMAP_THRESHOLD_=1048576 .venv/bin/python benchmarks/bench_fsdp_memory.py --breakdown --only ddp,fsdp

``--breakdown`` samples glibc's bytes in use and the RSS through set-up and each step's forward,
backward and optimizer step, and names the tensors (parameters, gradients, AdamW state, FSDP's
gathered parameters and unsharded gradients, saved activations); it writes
``fsdp_memory_breakdown-*.json`` (``--only`` too), never the default run's file.
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
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = [("one process", "single", 1, False), ("ddp, 2 ranks", "ddp_gloo", 2, False),
           ("fsdp, 2 ranks", "fsdp", 2, False), ("fsdp, 2 ranks, meta init", "fsdp", 2, True)]
SHORT = dict(zip(("single", "ddp", "fsdp", "fsdp-meta"), CONFIGS, strict=True))  # --only


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


#: glibc's struct mallinfo2 (glibc >= 2.33), all size_t
MALLINFO2 = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")


class MemoryProbe:
    """``--breakdown``: where a rank's memory goes, at the loop's hooks and in between.

    A thread samples every ``interval`` s, under the phase the last hook named: glibc's bytes in
    use (``mallinfo2``: ``uordblks`` in the arenas + ``hblkhd`` in mmapped blocks, where tensors
    over the mmap threshold live), the bytes glibc holds free in its arenas (``fordblks``) and the
    resident set (``/proc/self/statm``). Each phase keeps its highest in-use and RSS. At each hook a
    snapshot also adds ``ru_maxrss`` and the tensors one can name: parameters (local shards),
    gradients, optimizer state, FSDP's gathered parameters (all-gather outputs and unsharded
    parameters still allocated) and the activations autograd saved in the forward (storages not
    of a parameter)."""

    def __init__(self, interval: float = 0.002) -> None:
        import ctypes
        import threading

        class Info(ctypes.Structure):
            _fields_ = [(name, ctypes.c_size_t) for name in MALLINFO2]

        self.libc = ctypes.CDLL("libc.so.6")
        self.libc.mallinfo2.restype = Info
        self.libc.malloc_trim.argtypes = [ctypes.c_size_t]
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.phase = "start"
        self.phases: dict[str, dict] = {}
        self.snapshots: list[dict] = []
        self.model = self.optimizer = None
        self.saved: dict[int, int] = {}
        self.saved_hooks: Any = None
        self._lock, self._stop = threading.Lock(), threading.Event()
        self.interval = interval
        self.sample()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def glibc(self) -> tuple[float, float, float]:
        """(in use, free in the arenas, mmapped) in MB."""
        m = self.libc.mallinfo2()
        return (m.uordblks + m.hblkhd) / 2**20, m.fordblks / 2**20, m.hblkhd / 2**20

    def rss(self) -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self.page / 2**20

    def sample(self) -> None:
        in_use, _, _ = self.glibc()
        rss = self.rss()
        with self._lock:
            peak = self.phases.setdefault(self.phase, {"in_use": 0.0, "rss": 0.0, "samples": 0})
            peak["in_use"], peak["rss"] = max(peak["in_use"], in_use), max(peak["rss"], rss)
            peak["samples"] += 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval):  # numbers only: naming tensors from here raced the loop (SIGSEGV)
            self.sample()

    def enter(self, phase: str, **extra: float) -> None:
        """Close the current phase and open ``phase``, with a snapshot between them."""
        self.sample()
        in_use, free, mmapped = self.glibc()
        snap = {"at": phase, "in_use": in_use, "glibc_free": free, "mmapped": mmapped, "rss": self.rss(),
                "maxrss": _rss_mb(), **self.tensors(), **extra}
        with self._lock:
            self.snapshots.append(snap)
            self.phase = phase
        self.sample()

    def watch_collectives(self) -> None:
        """Name the tensors just before each of FSDP's all-gathers and reduce-scatters, on the
        loop's own thread; each phase keeps the one with the most bytes in use (``at_collective``)."""
        import torch.distributed as dist

        def watched(name: str, collective):
            def call(*args, **kwargs):
                tensors = [t for t in (*args, *kwargs.values()) if hasattr(t, "untyped_storage")]
                in_use, free, _ = self.glibc()
                phase = self.phases.setdefault(self.phase, {"in_use": 0.0, "rss": 0.0, "samples": 0})
                phase[f"{name}_calls"] = phase.get(f"{name}_calls", 0) + 1
                if in_use > phase.get("at_collective", {}).get("in_use", 0.0):
                    phase["at_collective"] = {"collective": name, "in_use": in_use, "glibc_free": free,
                                              "buffers": sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                                                              for t in tensors}.values()) / 2**20,
                                              "rss": self.rss(), **self.tensors()}
                return collective(*args, **kwargs)
            return call

        for name in ("all_gather_single", "reduce_scatter_single"):  # what FSDP2 calls, looked up at each call
            if hasattr(dist, name):
                setattr(dist, name, watched(name, getattr(dist, name)))

    def stop(self) -> dict:
        self._stop.set()
        self.thread.join()
        return {"phases": self.phases, "snapshots": self.snapshots}

    def tensors(self) -> dict[str, float]:
        """The tensors one can name, in MB (each storage once)."""
        import torch

        if self.model is None:
            return {}
        seen: set[int] = set()

        def size(t: torch.Tensor | None) -> int:
            if t is None:
                return 0
            t = t.to_local() if hasattr(t, "to_local") else t
            storage = t.untyped_storage()
            if storage.data_ptr() in seen or storage.nbytes() == 0:
                return 0
            seen.add(storage.data_ptr())
            return storage.nbytes()

        # the optimizer's parameters: the local shards under FSDP (the module's may be the gathered ones)
        params = ([p for group in self.optimizer.param_groups for p in group["params"]] if self.optimizer is not None
                  else list(self.model.parameters()))
        out = {"params": sum(size(p) for p in params), "grads": sum(size(p.grad) for p in params)}
        out["optimizer"] = 0
        if self.optimizer is not None:
            out["optimizer"] = sum(size(v) for moments in self.optimizer.state.values() for v in moments.values()
                                   if isinstance(v, torch.Tensor) and v.dim() > 0)
        gathered = unsharded_grads = 0
        for m in self.model.modules():  # FSDP2's internals: its gathered parameters still allocated
            group = getattr(getattr(m, "_get_fsdp_state", None) and m._get_fsdp_state(), "_fsdp_param_group", None)
            for fp in getattr(group, "fsdp_params", []):
                gathered += sum(size(t) for t in getattr(fp, "all_gather_outputs", []))
                unsharded = getattr(fp, "_unsharded_param", None)
                gathered += size(unsharded)
                unsharded_grads += size(getattr(unsharded, "grad", None))
        out["fsdp_gathered"], out["fsdp_unsharded_grads"] = gathered, unsharded_grads
        return {k: v / 2**20 for k, v in out.items()}

    # the activations autograd saves in the forward: storages that are not a parameter's
    def start_saving(self) -> None:
        import torch
        from torch import nn

        self.saved = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            base = t._base if t._base is not None else t
            if not isinstance(base, nn.Parameter) and t.layout == torch.strided and not t.is_meta:
                storage = t.untyped_storage()
                self.saved[storage.data_ptr()] = storage.nbytes()
            return t

        self.saved_hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
        self.saved_hooks.__enter__()

    def stop_saving(self) -> float:
        if self.saved_hooks is not None:
            self.saved_hooks.__exit__(None, None, None)
            self.saved_hooks = None
        return sum(self.saved.values()) / 2**20


def probe_callback(probe: MemoryProbe, trim: bool):
    """The fw callback that names the phases: set-up, then per step forward, backward, optimizer."""
    import framework as fw

    class Probe(fw.Callback):
        def setup(self, trainer, module, stage):
            probe.model = module
            probe.enter("setup: shard/DDP, optimizer")

        def on_fit_start(self, trainer, module):
            probe.optimizer = trainer.optimizers[0]
            probe.model = getattr(trainer.strategy, "model", None) or module  # FSDP's root, DDP's wrapper
            probe.enter("fit start")

        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            probe.enter(f"step {trainer.global_step + 1} fwd")
            probe.start_saving()

        def on_before_backward(self, trainer, module, loss):
            activations = probe.stop_saving()
            probe.enter(f"step {trainer.global_step + 1} bwd", activations=activations)

        def on_after_backward(self, trainer, module):
            probe.enter(f"step {trainer.global_step + 1} after bwd")

        def on_before_optimizer_step(self, trainer, module, optimizer):
            probe.enter(f"step {trainer.global_step + 1} optim+zero_grad")

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if trim:
                probe.libc.malloc_trim(0)
            probe.enter(f"after step {trainer.global_step}")

    return Probe()


def worker(args: argparse.Namespace) -> None:
    """One rank of one configuration: fit, then print this rank's figures as one JSON line."""
    sys.path.insert(0, str(ROOT))
    import torch
    from torch.utils.data import DataLoader

    import framework as fw
    from recipes.bench import SyntheticData, TinyGPT

    before = _rss_mb()
    probe = MemoryProbe() if args.breakdown else None
    if probe and args.strategy == "fsdp":
        probe.watch_collectives()
    strategy = {"name": "fsdp", "auto_wrap_policy": ["_TransformerBlock"]} if args.strategy == "fsdp" else args.strategy
    trainer = fw.Trainer(strategy=strategy, devices=args.devices, accelerator="cpu", max_steps=args.steps,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0,
                         callbacks=[probe_callback(probe, args.trim)] if probe else None)
    fw.seed_everything(0)
    if probe:
        probe.enter("build the model")
    with trainer.init_module() if args.meta else contextlib.nullcontext():
        model = TinyGPT(vocab=args.vocab, context=64, dim=args.dim, layers=args.layers, heads=args.heads)
    data = SyntheticData(kind="tokens", size=64, vocab=args.vocab, num_samples=64, batch_size=args.batch)
    data.setup("fit")
    if probe:
        probe.enter("fit: until setup")
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
    if probe:
        probe.enter("after fit")
        figures["breakdown"] = probe.stop()
    Path(args.out, f"rank{trainer.global_rank}.json").write_text(json.dumps(figures))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--batch", type=int, default=2, help="sequences per rank")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--breakdown", action="store_true",
                        help="also sample glibc's in-use bytes and the RSS per phase of set-up and of each step, and "
                             "name the tensors (MemoryProbe); writes fsdp_memory_breakdown-*.json")
    parser.add_argument("--trim", action="store_true", help="with --breakdown: malloc_trim(0) after every batch")
    parser.add_argument("--only", help=f"comma-separated configurations among {', '.join(SHORT)}")
    parser.add_argument("--worker", nargs=3, metavar=("STRATEGY", "DEVICES", "META"), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.strategy, args.devices, args.meta = args.worker[0], int(args.worker[1]), args.worker[2] == "1"
        worker(args)
        return
    sizes = ["--vocab", str(args.vocab), "--dim", str(args.dim), "--layers", str(args.layers), "--heads", str(args.heads),
             "--batch", str(args.batch), "--steps", str(args.steps)]
    sizes += ["--breakdown"] * args.breakdown + ["--trim"] * args.trim
    rows, results = [], {}
    for label, strategy, devices, meta in [SHORT[name] for name in args.only.split(",")] if args.only else CONFIGS:
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
    if args.breakdown:
        print_breakdown(results, print_table)
    name = "fsdp_memory_breakdown" if args.breakdown or args.only else "fsdp_memory"
    path = write_json(result_path(name), {**machine_info(), "args": vars(args), "ranks": results})
    print(f"wrote {path}")


def print_breakdown(results: dict, print_table) -> None:
    """``--breakdown``: per configuration and rank, where the peaks fall; then per phase."""
    rows = []
    for label, ranks in results.items():
        for r in ranks:
            phases, snaps = r["breakdown"]["phases"], r["breakdown"]["snapshots"]
            top_use = max(phases, key=lambda k: phases[k]["in_use"])
            top_rss = max(phases, key=lambda k: phases[k]["rss"])
            at = {snap["at"]: snap for snap in snaps}
            first = at.get("step 1 fwd", {}).get("maxrss", float("nan"))
            rows.append([f"{label}, rank {r['rank']}", f"{phases[top_use]['in_use']:.0f} ({top_use})",
                         f"{phases[top_rss]['rss']:.0f} ({top_rss})", f"{first:.0f}",
                         f"{at.get('after step 1', {}).get('maxrss', float('nan')):.0f}", f"{r['peak_mb']:.0f}",
                         f"{snaps[-1]['in_use']:.0f} / {snaps[-1]['glibc_free']:.0f} / {snaps[-1]['rss']:.0f}"])
    print_table("where the peak falls (MB; sampled every 2 ms)",
                ["run", "peak in use (glibc) and phase", "peak RSS and phase", "ru_maxrss at step 1",
                 "after step 1", "at the end", "end: in use / glibc free / RSS"], rows)
    for label, ranks in results.items():
        rows = []
        names = list(ranks[0]["breakdown"]["phases"])
        snaps = [{snap["at"]: snap for snap in r["breakdown"]["snapshots"]} for r in ranks]
        for name in names:
            cells = [name]
            for r in ranks:
                ph = r["breakdown"]["phases"].get(name, {"in_use": float("nan"), "rss": float("nan")})
                cells += [f"{ph['in_use']:.0f}", f"{ph['rss']:.0f}"]
            snap = snaps[0].get(name, {})  # rank 0's tensors as the phase starts
            named = ("params", "grads", "optimizer", "fsdp_gathered", "fsdp_unsharded_grads")
            cells.append(" ".join(f"{snap[k]:.0f}" if k in snap else "-" for k in named))
            cells.append(f"{snap.get('in_use', float('nan')):.0f}/{snap.get('glibc_free', float('nan')):.0f}/"
                         f"{snap.get('maxrss', float('nan')):.0f}")
            rows.append(cells)
        for name in ("step 1 bwd", "step 2 bwd"):  # the saved activations, at the end of the forward
            if name in snaps[0] and "activations" in snaps[0][name]:
                rows.append([f"(step {name[5]}: fwd saved {snaps[0][name]['activations']:.0f} MB of activations)"]
                            + [""] * (2 * len(ranks) + 2))
        columns = ["phase", *(f"r{r['rank']} {k}" for r in ranks for k in ("in use", "RSS"))]
        print_table(f"{label}: the highest in each phase (MB)",
                    [*columns, "r0 at start: params grads AdamW gathered unsh.grads", "r0 at start: in use / free / maxrss"],
                    rows)
        rows = []
        for name, ph in ranks[0]["breakdown"]["phases"].items():
            c = ph.get("at_collective")
            if c:
                rows.append([name, f"{ph.get('all_gather_single_calls', 0)} / {ph.get('reduce_scatter_single_calls', 0)}",
                             c["collective"].split("_")[0].replace("all", "all-gather").replace("reduce", "reduce-scatter"),
                             f"{c['in_use']:.0f}", f"{c['params']:.0f}", f"{c['grads']:.0f}",
                             f"{c['optimizer']:.0f}", f"{c['fsdp_gathered']:.0f}", f"{c['fsdp_unsharded_grads']:.0f}",
                             f"{c['buffers']:.0f}", f"{c['glibc_free']:.0f}", f"{c['rss']:.0f}"])
        if rows:
            print_table(f"{label}, rank 0: the tensors at the fullest collective of each phase (MB)",
                        ["phase", "AG / RS calls", "at", "in use", "params", "grads", "AdamW",
                         "gathered", "unsh. grads", "its buffers", "glibc free", "RSS"], rows)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
