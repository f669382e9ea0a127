"""Batch transfer walks tuples, lists, dicts, namedtuples and dataclasses (moved to the 'meta'
device here, so a move is visible without a GPU)."""

from __future__ import annotations

import dataclasses
from collections import namedtuple

import pytest
import torch

from framework.accelerators import CPUAccelerator, get_accelerator, move_to_device
from framework.errors import ConfigError

Pair = namedtuple("Pair", "x y")


@dataclasses.dataclass
class Batch:
    images: torch.Tensor
    labels: list
    name: str = "b"


def test_every_container_is_walked():
    meta = torch.device("meta")
    batch = {"pair": Pair(torch.ones(2), torch.zeros(2)), "list": [torch.ones(1), 3],
             "data": Batch(torch.ones(2, 2), [torch.ones(1)]), "tuple": (torch.ones(1),)}
    moved = move_to_device(batch, meta)
    assert isinstance(moved["pair"], Pair) and moved["pair"].x.device == meta
    assert moved["list"][0].device == meta and moved["list"][1] == 3
    assert isinstance(moved["data"], Batch) and moved["data"].images.device == meta
    assert moved["data"].labels[0].device == meta and moved["data"].name == "b"
    assert isinstance(moved["tuple"], tuple) and moved["tuple"][0].device == meta


def test_tensor_already_there_is_not_copied():
    t = torch.ones(3)
    assert move_to_device(t, torch.device("cpu")) is t
    batch = (torch.ones(1), torch.ones(1))
    assert CPUAccelerator().batch_to_device(batch, torch.device("cpu")) is batch


def test_unknown_accelerator_names_the_known_ones():
    with pytest.raises(ConfigError, match=r"unknown accelerator 'gpux'.*cpu, cuda, auto"):
        get_accelerator("gpux")
    assert get_accelerator("gpu" if torch.cuda.is_available() else "cpu").name in ("cpu", "cuda")
