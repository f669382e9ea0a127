"""Measure training throughput: batches and samples per second over a sliding window, and for a
module that counts its FLOPs (``flops_per_token()``) tokens per second per device and the model
FLOPs utilisation.

Logged on the batches where ``self.log``'s step rows are (every ``trainer.log_every_n_steps``
batches that stepped, ``trainer.state.log_due``), at their step, as ``throughput/batches_per_sec`` and ``throughput/samples_per_sec`` (global: this
rank's samples times the data-parallel ranks, as each of them runs the same per-rank batch). With
``flops_per_token``: ``throughput/tokens_per_sec_per_device`` (the global tokens over every device:
ranks that split a model share their batch's tokens) and, on a GPU whose bf16 peak ``PEAK_BF16``
knows (fw bench's MFU reads the same table) and in a bf16 precision, ``throughput/mfu`` = tokens/s per device x FLOPs per token
/ peak. A line at the end of training gives the run's figures after its first 10 batches. Timing is host-side and
unsynchronised; over a window of many batches, queued device work evens out.
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from framework.callbacks.base import Callback
from framework.errors import ConfigError

if TYPE_CHECKING:
    from framework.module import TrainModule
    from framework.trainer import Trainer


#: dense bf16 peak FLOP/s of one GPU (the vendors' data sheets), for MFU: the first pattern
#: that matches the device's name wins, so a variant comes before its family
PEAK_BF16 = (
    (r"\bMIG\b", None),  # a slice of a GPU: its share of the peak is not known here
    (r"\bH100\b.*\bPCIe\b", 756e12), (r"\bH100 NVL\b", 835e12), (r"\bH100\b", 989e12),
    (r"\bH200 NVL\b", 835e12), (r"\bG?H200\b", 989e12),
    (r"\bA100\b", 312e12), (r"\bL40S\b", 362e12), (r"\bL4\b", 121e12), (r"\bA10\b", 125e12),
)  # fmt: skip


def peak_for(name: str) -> float | None:
    """The bf16 peak of the GPU called ``name`` (as CUDA names it), None for one not in the table."""
    return next((peak for pattern, peak in PEAK_BF16 if re.search(pattern, name, re.IGNORECASE)), None)


def peak_flops(device: str) -> float | None:
    """The bf16 peak of the GPU this process sees, when it is in ``PEAK_BF16``."""
    if not device.startswith("cuda") or not torch.cuda.is_available():
        return None
    return peak_for(torch.cuda.get_device_name(0))


def default_batch_size(batch: Any) -> int:
    """The leading dimension of the first tensor found in ``batch`` (1 if there is none)."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() > 0 else 1
    if isinstance(batch, Mapping):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        for item in batch:
            size = default_batch_size(item)
            if size != 1 or isinstance(item, torch.Tensor):
                return size
    return 1


#: batches of a fit the closing line leaves out: compiling (``trainer.compile``) and warming up
WARM_UP_BATCHES = 10


def default_tokens(batch: Any) -> int:
    """The elements of the first tensor found in ``batch`` (a language model's: batch x time)."""
    if isinstance(batch, torch.Tensor):
        return int(batch.numel())
    if isinstance(batch, Mapping):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        return next((default_tokens(item) for item in batch if isinstance(item, (torch.Tensor, list, tuple, Mapping))), 0)
    return 0


class ThroughputMonitor(Callback):
    """Log batches/s and samples/s during training.

    Args:
        batch_size_fn: ``batch -> number of samples``; default: leading dim of the first tensor.
        window: Number of recent batches the rates are averaged over.
        tokens_fn: ``batch -> number of tokens`` (with ``flops_per_token``); default: the first
            tensor's elements.
    """

    def __init__(self, batch_size_fn: Callable[[Any], int] | None = None, window: int = 50,
                 tokens_fn: Callable[[Any], int] | None = None) -> None:
        if window < 1:
            raise ConfigError(f"ThroughputMonitor(window={window}) must be >= 1")
        self.batch_size_fn = batch_size_fn or default_batch_size
        self.tokens_fn = tokens_fn or default_tokens
        self.window = window
        self._times: deque[float] = deque(maxlen=window + 1)
        self._samples: deque[int] = deque(maxlen=window + 1)
        self._tokens: deque[int] = deque(maxlen=window + 1)
        self._flops_per_token: float | None = None
        self._peak: float | None = None
        self._no_mfu = ""  # why there is no MFU to give, when there is none
        self._totals = [0.0, 0]  # training seconds and this rank's tokens, for the closing line
        self._paused = 0.0
        self._batches = 0

    def on_train_start(self, trainer: Trainer, module: TrainModule) -> None:
        count = getattr(module, "flops_per_token", None)
        self._flops_per_token = float(count()) if callable(count) else None
        precision, device = str(trainer.precision), str(trainer.strategy.root_device)
        if self._flops_per_token and precision.startswith("bf16"):
            self._peak = peak_flops(device)
        self._no_mfu = ("" if self._peak else
                        "no MFU: it needs a GPU (this run is on the CPU)" if not device.startswith("cuda") else
                        f"no MFU: it is measured against the bf16 peak, and this run is {precision}"
                        if not precision.startswith("bf16") else
                        "no MFU: this GPU is not in the table of peaks (framework/callbacks/throughput.py's PEAK_BF16)")

    def on_train_epoch_start(self, trainer: Trainer, module: TrainModule) -> None:
        # The gap between epochs (validation, checkpointing) is not training time.
        self._times.clear()
        self._samples.clear()
        self._tokens.clear()
        self._times.append(time.perf_counter())
        self._samples.append(0)
        self._tokens.append(0)

    def on_validation_start(self, trainer: Trainer, module: TrainModule) -> None:
        self._paused = time.perf_counter()

    def on_validation_end(self, trainer: Trainer, module: TrainModule) -> None:
        """Validation inside an epoch is not training time: the window moves past it."""
        gap = time.perf_counter() - self._paused
        self._times = deque((t + gap for t in self._times), maxlen=self._times.maxlen)

    def on_train_batch_end(self, trainer: Trainer, module: TrainModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self._batches += 1
        warm = self._batches > WARM_UP_BATCHES  # the closing line leaves out compiling and warming up
        if warm:
            self._totals[0] += time.perf_counter() - self._times[-1]
        self._times.append(time.perf_counter())
        self._samples.append(self.batch_size_fn(batch))
        if self._flops_per_token:
            tokens = self.tokens_fn(batch)
            self._tokens.append(tokens)
            self._totals[1] += tokens if warm else 0
        if len(self._times) < 2 or not trainer.state.log_due:  # the steps self.log's rows land on
            return
        elapsed = self._times[-1] - self._times[0]
        if elapsed <= 0:
            return
        batches = len(self._times) - 1
        samples = sum(list(self._samples)[1:])
        replicas = trainer.strategy.data_parallel_size
        rates = {"throughput/batches_per_sec": batches / elapsed,
                 "throughput/samples_per_sec": samples * replicas / elapsed}
        if self._flops_per_token:
            rates.update(self._token_rates(sum(list(self._tokens)[1:]) / elapsed, trainer))
        trainer.log_metrics(rates, step=trainer.state.logger_step)

    def _token_rates(self, tokens_per_s: float, trainer: Trainer) -> dict[str, float]:
        """This rank's tokens/s as tokens/s per device, and the MFU where the peak is known."""
        per_device = tokens_per_s * trainer.strategy.data_parallel_size / trainer.world_size
        rates = {"throughput/tokens_per_sec_per_device": per_device}
        if self._peak and self._flops_per_token:
            rates["throughput/mfu"] = per_device * self._flops_per_token / self._peak
        return rates

    def on_train_end(self, trainer: Trainer, module: TrainModule) -> None:
        seconds, tokens = self._totals
        if not self._flops_per_token or seconds <= 0:
            return
        from framework.rank_zero import rank_zero_info

        rates = self._token_rates(tokens / seconds, trainer)
        mfu = rates.get("throughput/mfu")
        rank_zero_info(f"fw: throughput: {rates['throughput/tokens_per_sec_per_device']:,.0f} tokens/s per device, "
                       f"{self._flops_per_token / 1e6:.1f} MFLOPs per token"
                       + (f", MFU {100 * mfu:.1f} % of the bf16 peak" if mfu is not None else f"; {self._no_mfu}"))
