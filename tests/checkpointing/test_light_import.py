"""Importing a checkpoint module loads fw's checkpointing package and its core alone (errors,
paths, rank_zero, ...), not the strategies, the loops, the callbacks or the Trainer: reading a
checkpoint (``fw checkpoint export``, ``load_from_checkpoint``, a script) costs what it reads.
Measured on 2f6bccb: the checkpoint modules of then loaded 129 of fw's modules, the Trainer's
among them; framework/checkpointing/ loads 14."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import framework

PACKAGE = Path(framework.__file__).parent / "checkpointing"
MODULES = [f"framework.checkpointing.{path.stem}" for path in sorted(PACKAGE.glob("*.py")) if path.stem != "__init__"]
#: what checkpointing/ may import of fw besides itself: the core layer of pyproject.toml's layers
CORE = {"errors", "types", "rank_zero", "seed", "paths", "intervals", "waiting", "optim"}


def _loaded_after(imports: str) -> dict:
    """The modules a fresh process holds after ``imports``: fw's, and whether DCP is among them."""
    code = (f"import sys; {imports}; import json; "
            "print(json.dumps({'fw': sorted(m for m in sys.modules if m.split('.')[0] == 'framework'), "
            "'dcp': 'torch.distributed.checkpoint' in sys.modules}))")
    root = str(Path(framework.__file__).parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_the_checkpoint_modules_load_only_checkpointing_and_the_core():
    assert {"file", "parts", "search", "index", "sharded", "single_file"} <= {m.rsplit(".", 1)[1] for m in MODULES}
    loaded = _loaded_after("; ".join(f"import {module}" for module in MODULES))
    for package in ("framework.trainer", "framework.strategies", "framework.loops", "framework.callbacks"):
        assert package not in loaded["fw"]
    others = [m for m in loaded["fw"] if m != "framework" and not m.startswith("framework.checkpointing")
              and m.split(".")[1] not in CORE]
    assert others == [], f"checkpointing/ loads more of fw than its core: {others}"
    assert not loaded["dcp"], "torch.distributed.checkpoint is imported when a sharded folder is first read"


def test_the_package_alone_imports_none_of_its_modules():
    assert _loaded_after("import framework.checkpointing") == {"fw": ["framework", "framework.checkpointing"],
                                                               "dcp": False}
