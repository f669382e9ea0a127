"""Loading Lightning's public examples (``tests/lightning/examples/``, their sources as fetched) for
either side, with their import lines changed and nothing else; the stand-ins for what this
machine cannot have (torchvision, the MNIST download); the seeded gym environments.

``lightning`` runs an example on pytorch_lightning 2.6.6: the examples import the unified
``lightning`` package, whose ``lightning.pytorch`` is the same code as the standalone
``pytorch_lightning`` installed here, so ``lightning.pytorch`` becomes ``pytorch_lightning``.
``fw`` runs it on fw: each Lightning import line becomes the fw line in ``FW_IMPORTS``.
"""

from __future__ import annotations

import importlib.util
import math
import sys
import types
from pathlib import Path

import numpy as np
import torch

EXAMPLES = Path(__file__).resolve().parent / "examples"
DEMOS = Path(importlib.util.find_spec("pytorch_lightning").origin).parent / "demos"

#: the Lightning import lines of the examples (and of the two demo files they import), as fw
#: writes them. A name fw does not have is left out only where the example uses it in its
#: ``__main__`` block or ``cli_main()`` alone (``cli_lightning_logo``, ``LightningCLI``), which the
#: tests do not run; they say so.
FW_IMPORTS = {
    "from lightning.pytorch import LightningDataModule, LightningModule, Trainer, callbacks, cli_lightning_logo":
        "from framework import DataModule as LightningDataModule, TrainModule as LightningModule, Trainer, callbacks",
    "from lightning.pytorch import LightningDataModule, LightningModule, cli_lightning_logo":
        "from framework import DataModule as LightningDataModule, TrainModule as LightningModule",
    "from lightning.pytorch import LightningModule, Trainer, cli_lightning_logo, seed_everything":
        "from framework import TrainModule as LightningModule, Trainer, seed_everything",
    "from lightning.pytorch import LightningModule, Trainer, cli_lightning_logo":
        "from framework import TrainModule as LightningModule, Trainer",
    "from lightning.pytorch import LightningModule, Trainer": "from framework import TrainModule as LightningModule, Trainer",
    "from lightning.pytorch import cli_lightning_logo": "",
    "from lightning.pytorch.core import LightningModule": "from framework import TrainModule as LightningModule",
    "from lightning.pytorch.trainer import Trainer": "from framework import Trainer",
    "from lightning.pytorch.cli import LightningCLI": "",
    "from lightning.pytorch.utilities import rank_zero_only": "from framework import rank_zero_only",
    "from lightning.pytorch.demos.mnist_datamodule import MNISTDataModule":
        "from fw_demo_mnist_datamodule import MNISTDataModule",
    "from lightning.pytorch.demos.mnist_datamodule import MNIST": "from fw_demo_mnist_datamodule import MNIST",
    "from lightning.pytorch.demos import Transformer, WikiText2": "from fw_demo_transformer import Transformer, WikiText2",
    "import lightning as L": "import framework as L",
    # the demo files, for fw
    "from pytorch_lightning import LightningDataModule": "from framework import DataModule as LightningDataModule",
    "from pytorch_lightning import LightningModule": "from framework import TrainModule as LightningModule",
    "from lightning_fabric.utilities.imports import _IS_WINDOWS": "_IS_WINDOWS = os.name == 'nt'",
    "from lightning_utilities.core.imports import RequirementCache":  # a utility package, not Lightning's trainer
        "from lightning_utilities.core.imports import RequirementCache",
}

#: the examples, both sides: torchvision is there (the real one, or ``torchvision_stand_in``),
#: whatever the installed-package check of Lightning's utilities says
TORCHVISION_FLAG = "from lightning.pytorch.utilities.imports import _TORCHVISION_AVAILABLE"
#: the demo files, for fw: the value Lightning's own copy of them sees
DEMO_TORCHVISION_FLAG = "from pytorch_lightning.utilities.imports import _TORCHVISION_AVAILABLE"


def changed_source(source: str, which: str) -> str:
    """``source`` with each Lightning import line rewritten for ``which``; every other line as it was."""
    from pytorch_lightning.utilities.imports import _TORCHVISION_AVAILABLE

    lines = []
    for line in source.splitlines():
        key = line.strip()
        if key == TORCHVISION_FLAG:
            line = line.replace(key, "_TORCHVISION_AVAILABLE = True")
        elif key == DEMO_TORCHVISION_FLAG:
            line = line.replace(key, f"_TORCHVISION_AVAILABLE = {bool(_TORCHVISION_AVAILABLE)}")
        elif "lightning" in key and key.startswith(("from ", "import ")):
            if which == "lightning":
                line = line.replace("import lightning as L", "import pytorch_lightning as L")
                line = line.replace("lightning.pytorch", "pytorch_lightning")
            else:
                assert key in FW_IMPORTS, f"no fw import for: {key}"
                line = line.replace(key, FW_IMPORTS[key])
        lines.append(line)
    return "\n".join(lines) + "\n"


def load(path: Path, which: str, name: str, where: Path) -> types.ModuleType:
    """The module at ``path`` for ``which``, its changed source written to ``where`` and run from there
    (an example finds its data beside itself: ``DATASETS_PATH``)."""
    where.parent.mkdir(parents=True, exist_ok=True)
    where.write_text(changed_source(path.read_text(), which))
    module = types.ModuleType(name)
    module.__file__ = str(where)
    sys.modules[name] = module  # the fw demos import one another by these names
    stand_in = "torchvision" not in sys.modules and importlib.util.find_spec("torchvision") is None
    if stand_in:  # only while the example imports it: libraries that probe for torchvision
        sys.modules.update(torchvision_stand_in())  # (torchmetrics) must not find it
    try:
        exec(compile(where.read_text(), str(where), "exec"), module.__dict__)
    finally:
        if stand_in:
            for key in TORCHVISION_MODULES:
                sys.modules.pop(key, None)
    return module


def example(relative: str, which: str, root: Path) -> types.ModuleType:
    """Lightning's ``examples/pytorch/<relative>`` for ``which``, living under ``root/examples/pytorch``.
    For fw, the Lightning demo files it imports are loaded first, their imports changed alike."""
    if which == "fw":
        for demo in ("transformer", "mnist_datamodule"):
            load(DEMOS / f"{demo}.py", "fw", f"fw_demo_{demo}", root / "demos" / f"{demo}.py")
    stem = Path(relative).stem
    return load(EXAMPLES / relative, which, f"{which}_example_{stem}", root / "examples" / "pytorch" / relative)


def forget_loaded() -> None:
    for name in [n for n in sys.modules if n.startswith(("fw_demo_", "fw_example_", "lightning_example_"))]:
        del sys.modules[name]


# -- torchvision ----------------------------------------------------------------------------------
def make_grid(tensor, nrow=8, padding=2, normalize=False, value_range=None, scale_each=False, pad_value=0.0):
    """torchvision's ``make_grid``: a batch of images tiled ``nrow`` to a row, ``padding`` apart."""
    tensor = tensor.detach().clone()
    if tensor.dim() == 3:
        tensor = tensor.unsqueeze(0)
    if tensor.size(1) == 1:
        tensor = torch.cat((tensor, tensor, tensor), 1)
    if normalize:
        parts = list(tensor) if scale_each else [tensor]
        for part in parts:
            low, high = value_range if value_range is not None else (float(part.min()), float(part.max()))
            part.clamp_(min=low, max=high).sub_(low).div_(max(high - low, 1e-5))
    n, channels, height, width = tensor.shape
    cols, rows = min(nrow, n), math.ceil(n / min(nrow, n))
    grid = tensor.new_full((channels, rows * (height + padding) + padding, cols * (width + padding) + padding),
                           pad_value)
    for k in range(n):
        top, left = (k // cols) * (height + padding) + padding, (k % cols) * (width + padding) + padding
        grid[:, top:top + height, left:left + width] = tensor[k]
    return grid


def save_image(tensor, fp, format=None, **grid_args) -> None:
    """torchvision's ``save_image``: the grid, as 8-bit RGB, through Pillow."""
    from PIL import Image

    grid = make_grid(tensor, **grid_args)
    pixels = grid.mul(255).add_(0.5).clamp_(0, 255).permute(1, 2, 0).to(torch.uint8).numpy()
    Image.fromarray(pixels).save(fp, format=format)


class ToTensor:
    """torchvision's ``ToTensor``: a PIL image or an HxWxC array to a CxHxW float tensor in [0, 1]."""

    def __call__(self, picture):
        array = np.array(picture)
        if array.ndim == 2:
            array = array[:, :, None]
        return torch.from_numpy(array.transpose(2, 0, 1).copy()).float().div(255)


class Normalize:
    def __init__(self, mean, std):
        self.mean, self.std = torch.tensor(mean)[:, None, None], torch.tensor(std)[:, None, None]

    def __call__(self, tensor):
        return (tensor - self.mean) / self.std


class Compose:
    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, value):
        for transform in self.transforms:
            value = transform(value)
        return value


TORCHVISION_MODULES = ("torchvision", "torchvision.utils", "torchvision.transforms")


def torchvision_stand_in() -> dict[str, types.ModuleType]:
    """What the examples use of torchvision (``utils.make_grid``, ``utils.save_image``,
    ``transforms.ToTensor/Normalize/Compose``), for ``sys.modules``: torchvision's PyPI wheel is
    a CUDA build that does not load against this CPU torch, and its CPU wheel is on an index this
    machine cannot reach."""
    torchvision = types.ModuleType("torchvision")
    utils = types.ModuleType("torchvision.utils")
    utils.make_grid, utils.save_image = make_grid, save_image
    transforms = types.ModuleType("torchvision.transforms")
    transforms.ToTensor, transforms.Normalize, transforms.Compose = ToTensor, Normalize, Compose
    torchvision.utils, torchvision.transforms = utils, transforms
    return {"torchvision": torchvision, "torchvision.utils": utils, "torchvision.transforms": transforms}


# -- data -----------------------------------------------------------------------------------------
def write_mnist(root: Path, train: int = 60000, test: int = 256) -> None:
    """MNIST-shaped files where Lightning's MNIST demo reads them (``<root>/MNIST/complete``, its
    hosted copy's layout, used under ``PL_USE_MOCKED_MNIST``): 28x28 uint8 strokes on black."""
    g = torch.Generator().manual_seed(0)
    folder = root / "MNIST" / "complete"
    folder.mkdir(parents=True, exist_ok=True)
    for name, n in (("training.pt", train), ("test.pt", test)):
        pixels = torch.randint(0, 256, (n, 28, 28), generator=g, dtype=torch.uint8)
        ink = torch.rand(n, 28, 28, generator=g) < 0.2
        torch.save((pixels * ink, torch.randint(0, 10, (n,), generator=g)), folder / name)


def write_wikitext(folder: Path, lines: int = 400) -> None:
    """``<folder>/wikitext-2.txt``, where the demos' WikiText2 looks (and then downloads nothing)."""
    g = torch.Generator().manual_seed(0)
    words = [f"w{i}" for i in range(60)]
    text = [" ".join(words[int(j)] for j in torch.randint(0, 60, (12,), generator=g)) for _ in range(lines)]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "wikitext-2.txt").write_text("\n".join(text) + "\n")


# -- gym --------------------------------------------------------------------------------------------
SEEDED_CARTPOLE = {"SeededCartPole-v0": 200, "SeededCartPole-v1": 500}


def seeded_cartpole(seed: int = 0):
    """CartPole with its own random streams seeded: gym seeds an unseeded environment (its start
    states, its action space's ``sample()``) from the operating system, so no two runs agree."""
    from gym.envs.classic_control import CartPoleEnv

    env = CartPoleEnv()
    env.reset(seed=seed)
    env.action_space.seed(seed)
    return env


def register_seeded_cartpole() -> None:
    import gym

    for env_id, steps in SEEDED_CARTPOLE.items():
        if env_id not in gym.envs.registry.env_specs:
            gym.register(id=env_id, entry_point=seeded_cartpole, max_episode_steps=steps)
