"""``fw checkpoint export SRC OUT``: one consolidated file from a checkpoint, a sharded folder in
particular, that plain PyTorch loads: ``torch.load(OUT)["state_dict"]`` goes into
``nn.Module.load_state_dict`` of the model it came from, and fw resumes from it as from the
folder (on any number of ranks, under any strategy: the optimizer state is keyed by parameter
name). The tensors are read into this process's CPU memory: the machine running it needs room
for the whole model and optimizer state (the folder never did)."""

from __future__ import annotations

import argparse
import os

from framework.errors import CheckpointError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="{export}")
    export = sub.add_parser("export", help="write a checkpoint (a sharded folder too) as one file plain torch loads")
    export.add_argument("source", help="a checkpoint: a sharded checkpoint's folder, or a file")
    export.add_argument("out", help="the file to write (e.g. model.pt)")
    export.add_argument("--weights-only", action="store_true",
                        help="write the model's state_dict alone (no optimizer, progress or RNG states)")


def export(args: argparse.Namespace) -> str:
    """Write ``args.out``; the line to print."""
    from framework.checkpointing import file as ckpt

    source, out = os.fspath(args.source), os.fspath(args.out)
    if os.path.abspath(source) == os.path.abspath(out):
        raise CheckpointError(f"fw checkpoint export: OUT '{out}' is the checkpoint itself; give another file name")
    if os.path.isdir(out):
        raise CheckpointError(f"fw checkpoint export: OUT '{out}' is a directory; give a file name, e.g. {out}/model.pt")
    checkpoint = ckpt.load_checkpoint(source)
    checkpoint.pop("fw_sharded", None)
    weights = checkpoint["state_dict"]
    ckpt.atomic_save(weights if args.weights_only else checkpoint, out)
    size = sum(t.numel() * t.element_size() for t in weights.values() if hasattr(t, "numel"))
    what = "the model's state_dict" if args.weights_only else "the checkpoint"
    return f"fw: wrote {out}: {what} ({len(weights)} tensors of the model, {size / 2**20:.1f} MiB) from {source}"
