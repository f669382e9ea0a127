"""The recipe's schema: typed dataclasses that OmegaConf checks a YAML file against.

Types are checked here (``max_epochs: abc`` fails with the key's path); meanings (is this a
known strategy?) are checked by the Trainer, which raises ``ConfigError`` naming the key.
Fields typed ``Any`` take several forms (``devices: 2`` or ``[0, 1]`` or ``auto``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class TrainerConfig:
    """The Trainer's keyword arguments (Lightning's names); see ``framework.Trainer``."""

    accelerator: str = "auto"  # cpu | cuda | auto
    devices: Any = "auto"  # count, list of GPU indices, or auto
    num_nodes: int = 1
    strategy: Any = "auto"  # name, or {name: ddp_gloo, init_method: tcp://..., timeout: 600, ...}
    precision: Any = "32"  # 32 | bf16-mixed | 16-mixed
    max_epochs: Optional[int] = None
    min_epochs: Optional[int] = None
    max_steps: int = -1
    max_time: Any = None  # seconds, "DD:HH:MM:SS" or {days, hours, minutes, seconds}
    limit_train_batches: Any = None  # int batches or float fraction
    limit_val_batches: Any = None
    limit_test_batches: Any = None
    limit_predict_batches: Any = None
    val_check_interval: Any = None
    check_val_every_n_epoch: Optional[int] = 1
    num_sanity_val_steps: int = 2
    log_every_n_steps: int = 50
    enable_checkpointing: bool = True
    enable_progress_bar: bool = True
    accumulate_grad_batches: int = 1
    gradient_clip_val: Optional[float] = None
    gradient_clip_algorithm: str = "norm"
    deterministic: bool = False
    default_root_dir: Optional[str] = None
    max_restarts: int = 0
    rdzv_endpoint: Optional[str] = None


@dataclass
class RecipeConfig:
    """A whole recipe: what to build (``module``, ``data``, ``callbacks``, ``logger``, each
    ``_target_`` + keyword arguments) and how to run it (``trainer``, ``seed``, ``ckpt_path``)."""

    module: Any = None
    data: Any = None
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    callbacks: Any = field(default_factory=list)
    logger: Any = True
    seed: Optional[int] = None
    ckpt_path: Optional[str] = None
