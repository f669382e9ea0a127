"""fw's ``fsdp`` against a hand-written FSDP2 loop: the same GPT, the same units and mesh, the
same data and AdamW, whole calls as users make them, side by side in one run.

Why: fw's ``fsdp`` should cost no more than the same FSDP2 training written by hand.
Read: the fw / hand-written ratio's median over rounds and its 95 % interval (1: the same);
the start-up, steps and end columns say in which part a difference lies.
Time: a round is two 100-step fits, 8-15 s each on 2 cores: about 5 minutes with 15 rounds;
``--steps 10 --rounds 2`` under a minute.
Run: ``python benchmarks/run.py fsdp_step [--rounds 5]`` (2 ranks under torchrun).

Each round times one ``fit`` of ``--steps`` steps on each side, start-up included (building the
model, sharding it, the optimizer, the loader; the process group exists already for both), in
alternating order. The hand-written side is what a user writes without a framework:
``fully_shard`` on each transformer block and then on the network, AdamW, a
``DistributedSampler``, and forward / backward / step / zero_grad. The fw side is
``Trainer(strategy={"name": "fsdp", "auto_wrap_policy": ["_TransformerBlock"]}).fit``. The
ratio fw / hand-written is reported per round: its median and a 95 % bootstrap interval. An
optimizer-step hook on both sides splits each call into its start-up (to the end of the first
step), the steps after it and its end (after the last step), reported as medians.

Run::

    .venv/bin/python -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/bench_fsdp_step.py
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from bench_fit import median_interval  # noqa: E402
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset  # noqa: E402

import framework as fw  # noqa: E402
from framework.bench.common import machine_info, median, print_table, result_path, write_json  # noqa: E402
from recipes.bench import TinyGPT  # noqa: E402

#: the processes ``benchmarks/run.py`` starts this script in (under torchrun; ``--ranks`` overrides)
LAUNCH_RANKS = 2
GPT = {"vocab": 256, "context": 64, "dim": 192, "layers": 3, "heads": 6}  # conf/bench/gpt.yaml


def tokens(n: int) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, GPT["vocab"], (n, GPT["context"]), generator=g)
    return TensorDataset(x, torch.roll(x, -1, dims=1))


STEP_ENDS: list[float] = []  # when each optimizer step of the current call ended (perf_counter)


def _step_ended(*_: object) -> None:
    STEP_ENDS.append(time.perf_counter())


class _TimedGPT(TinyGPT):
    def configure_optimizers(self):
        optimizer = super().configure_optimizers()
        optimizer.register_step_post_hook(_step_ended)
        return optimizer


def hand_written(steps: int, batch: int) -> float:
    from torch.distributed.fsdp import fully_shard

    start = time.perf_counter()
    torch.manual_seed(0)
    model = TinyGPT(**GPT)
    for block in model.net.blocks:
        fully_shard(block)
    fully_shard(model.net)
    opt = torch.optim.AdamW(model.net.parameters(), lr=model.lr, weight_decay=model.weight_decay)
    opt.register_step_post_hook(_step_ended)
    data = tokens(steps * batch * dist.get_world_size())
    loader = DataLoader(data, batch_size=batch, sampler=DistributedSampler(data, shuffle=False))
    for x, y in loader:
        loss = TinyGPT.criterion(model.net(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    dist.barrier()
    return time.perf_counter() - start


def with_fw(steps: int, batch: int) -> float:
    start = time.perf_counter()
    torch.manual_seed(0)
    model = _TimedGPT(**GPT)
    trainer = fw.Trainer(strategy={"name": "fsdp", "auto_wrap_policy": ["_TransformerBlock"]}, devices=2,
                         accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(model, DataLoader(tokens(steps * batch * dist.get_world_size()), batch_size=batch))
    dist.barrier()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch", type=int, default=8, help="sequences per rank")
    parser.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    import logging

    logging.getLogger("framework").setLevel(logging.WARNING)  # fw's start-up lines, once per round
    with_fw(5, args.batch), hand_written(5, args.batch)  # warm-up: first imports and allocations
    times: dict[str, list[float]] = {"hand-written FSDP2": [], "fw fsdp": []}
    phases: dict[str, list[tuple[float, float, float]]] = {name: [] for name in times}
    for round_ in range(args.rounds):
        sides = [("hand-written FSDP2", hand_written), ("fw fsdp", with_fw)]
        for name, side in sides if round_ % 2 == 0 else reversed(sides):
            STEP_ENDS.clear()
            begun = time.perf_counter()
            times[name].append(side(args.steps, args.batch))
            ended = time.perf_counter()
            phases[name].append((STEP_ENDS[0] - begun, STEP_ENDS[-1] - STEP_ENDS[0], ended - STEP_ENDS[-1]))
    if dist.get_rank() == 0:
        ratios = [f / h for f, h in zip(times["fw fsdp"], times["hand-written FSDP2"], strict=True)]
        low, high = median_interval(ratios)
        rows = [[name, f"{median(values):.3f} s", f"{min(values):.3f}-{max(values):.3f} s"] for name, values in times.items()]
        rows.append(["fw / hand-written", f"{median(ratios):.3f}", f"95 % interval {low:.3f}-{high:.3f}"])
        print_table(f"fit of {args.steps} steps, FSDP on 2 ranks, start-up included ({args.rounds} rounds)",
                    ["side", "median", "range"], rows)
        def ms(values: list[tuple[float, float, float]], part: int, per: int = 1) -> str:
            return f"{median([v[part] for v in values]) * 1e3 / per:.1f} ms"

        later = max(1, args.steps - 1)  # the steps after the first
        split = [[name, ms(values, 0), ms(values, 1, later), ms(values, 2)] for name, values in phases.items()]
        print_table("medians of each call's parts (rank 0)", ["side", "start-up and first step", "each later step",
                                                              "after the last step"], split)
        result = {**machine_info(), "args": vars(args), "times_s": times, "ratio_median": median(ratios),
                  "ratio_interval": [low, high], "phases_s": phases}
        print(f"wrote {write_json(result_path('fsdp_step', out=args.out), result)}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
