"""Seeding and the RNG state that exact resume needs."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

_seed: int | None = None  # what seed_everything was last called with


def seed_everything(seed: int) -> int:
    """Seed Python, NumPy and torch (all devices), and remember the seed for samplers.

    A run reads it once at set-up (``sampler_seed``) and hands it to the distributed samplers
    as a value, so every rank shuffles alike. Workers that fw or torchrun start run the program
    again, and so call ``seed_everything`` themselves: nothing travels through the environment.
    """
    global _seed
    seed = int(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    _seed = seed
    return seed


def sampler_seed(default: int = 0) -> int:
    """The seed distributed samplers shuffle with: the last ``seed_everything``'s, else 0."""
    return _seed if _seed is not None else default


def get_rng_state() -> dict:
    """Every RNG state a training step can draw from, in types ``weights_only`` loading accepts."""
    legacy = np.random.get_state(legacy=True)
    assert isinstance(legacy, tuple), "legacy=True gives MT19937's state as a tuple"
    kind, keys, pos, has_gauss, cached = legacy
    state = {
        "python": random.getstate(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


@contextlib.contextmanager
def isolated_rng() -> Iterator[None]:
    """Inside, draw from every random stream; after, they are as they were (Lightning's
    ``isolate_rng``, around its sanity check)."""
    state = get_rng_state()
    try:
        yield
    finally:
        set_rng_state(state)


def set_rng_state(state: dict) -> None:
    random.setstate(_as_python_state(state["python"]))
    np_state = state["numpy"]
    np.random.set_state(
        (
            np_state["kind"],
            np_state["keys"].numpy().astype(np.uint32),
            np_state["pos"],
            np_state["has_gauss"],
            np_state["cached_gaussian"],
        )
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _as_python_state(state: Any) -> tuple[Any, ...]:
    # random.setstate wants (version, tuple, gauss); a round trip may turn tuples into lists
    version, internal, gauss = state
    return (version, tuple(internal), gauss)
