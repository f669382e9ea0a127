"""``trainer.devices`` with Lightning's meanings: ``-1`` (and ``"-1"``) is every visible GPU on
CUDA and an error on the CPU (it ran one process silently), ``0`` is an error everywhere, counts
may be strings. The CUDA cases run on mocked device counts (this machine has no GPU)."""

from __future__ import annotations

import sys

import pytest
import torch

import framework as fw
from framework.errors import ConfigError

QUIET = dict(logger=False, enable_progress_bar=False)


@pytest.mark.parametrize("devices", [-1, "-1", " -1 "])
def test_minus_one_on_the_cpu_is_a_one_line_error_naming_the_fix(devices):
    with pytest.raises(ConfigError) as err:
        fw.Trainer(accelerator="cpu", devices=devices, **QUIET)
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith("trainer.devices=-1 means every GPU, and trainer.accelerator=cpu has none"), text
    assert "set trainer.devices to the number of processes" in text


@pytest.mark.parametrize("devices", [0, "0", -2, [1, 1], [], "two"])
@pytest.mark.parametrize("accelerator", ["cpu", "cuda"])
def test_zero_negative_repeated_and_unreadable_devices_are_refused(devices, accelerator, monkeypatch):
    _gpus(monkeypatch, 2)
    with pytest.raises(ConfigError, match=r"trainer\.devices="):
        fw.Trainer(accelerator=accelerator, devices=devices, **QUIET)


@pytest.mark.parametrize(("devices", "expected"), [("auto", [0]), (1, [0]), (2, [0, 1]), ("2", [0, 1]), (" 3 ", [0, 1, 2])])
def test_counts_on_the_cpu(devices, expected, monkeypatch):
    monkeypatch.setattr(sys, "argv", [__file__])  # a program run from its file (a pytest-xdist worker is `python -c`)
    trainer = fw.Trainer(accelerator="cpu", devices=devices, **QUIET)
    assert trainer.devices == expected
    if len(expected) > 1:  # fw's launcher will start that many workers
        assert trainer.launcher.nproc_per_node == len(expected)


def _gpus(monkeypatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


@pytest.mark.parametrize("devices", [-1, "-1", "auto"])
@pytest.mark.parametrize("accelerator", ["cuda", "gpu", "auto"])
def test_minus_one_on_cuda_is_every_visible_gpu(devices, accelerator, monkeypatch):
    _gpus(monkeypatch, 3)
    monkeypatch.setattr(sys, "argv", [__file__])  # not an interactive session, where auto is ddp_notebook
    trainer = fw.Trainer(accelerator=accelerator, devices=devices, **QUIET)
    assert trainer.accelerator.name == "cuda" and trainer.devices == [0, 1, 2]
    assert trainer.strategy.name == "ddp_nccl" and trainer.launcher.nproc_per_node == 3


def test_minus_one_on_one_gpu_is_that_gpu_in_one_process(monkeypatch):
    _gpus(monkeypatch, 1)
    trainer = fw.Trainer(accelerator="cuda", devices=-1, **QUIET)
    assert trainer.devices == [0] and trainer.strategy.name == "single" and trainer.launcher is None


def test_gpu_lists_and_counts_are_checked_against_the_visible_gpus(monkeypatch):
    _gpus(monkeypatch, 2)
    assert fw.Trainer(accelerator="cuda", devices=[1], **QUIET).devices == [1]
    with pytest.raises(ConfigError, match="this machine has 2 GPU"):
        fw.Trainer(accelerator="cuda", devices=3, **QUIET)
    with pytest.raises(ConfigError, match="this machine has 2 GPU"):
        fw.Trainer(accelerator="cuda", devices=[0, 2], **QUIET)


def test_minus_one_with_no_visible_gpu_says_so():
    from framework.accelerators import CUDAAccelerator
    from framework.trainer.arguments import parse_devices

    class NoneVisible(CUDAAccelerator):  # CUDA reported available, CUDA_VISIBLE_DEVICES="" hides every GPU
        @staticmethod
        def device_count() -> int:
            return 0

    with pytest.raises(ConfigError, match=r"trainer.devices=-1: no GPU is visible.*CUDA_VISIBLE_DEVICES"):
        parse_devices(-1, NoneVisible())
