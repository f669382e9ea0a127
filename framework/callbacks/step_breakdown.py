"""Where a training step's time goes: data wait, forward+backward, optimizer, and the gradient
communication that backward did not hide.

``StepTimeBreakdown`` reads the clock at hooks the loop calls anyway (``on_train_batch_start``,
``on_before_backward``, ``on_after_backward``, ``on_train_batch_end``), so for one batch:

* **data wait**: from the end of the previous batch to the start of this one (the loader's
  ``next`` and the copy to the device);
* **forward+backward**: ``training_step`` and its backward, without the waits for communication;
* **optimizer**: from the end of backward to the end of the batch (``on_before_optimizer_step``,
  clipping, ``step``, ``zero_grad``);
* **comm (unhidden)**: the gradient all-reduce time that backward spent waiting, measured by a
  DDP communication hook that times each bucket: the time spent inside the hook (a synchronous
  process group blocks there) plus the wait between the last bucket's launch and the end of
  backward. Communication that ran while backward computed is hidden and not counted here;
  ``comm_span`` runs from the first bucket's launch to the end of the last all-reduce (or of
  backward, if later): the stretch of backward the all-reduces overlapped.
* **other**: the rest (hooks, logging, the loop itself).

The hook reduces exactly as DDP's built-in one (divide the bucket by the world size, all-reduce
sum), so the trained weights are bitwise the same with or without the breakdown (except with
``gradient_as_bucket_view`` and ``zero_grad(set_to_none=False)``, where DDP scales in place).
On CUDA the times are the host's: with NCCL, whose futures complete when the work is queued,
the unhidden part also holds backward kernels still queued when the host finished. It is only
registered when the strategy's model is ``DistributedDataParallel`` without a hook of its own,
and ``comm=False`` leaves DDP alone. On CUDA each reading synchronises the device
(``synchronize``), which costs a little throughput in exchange for true per-part times.

Where ``self.log``'s step rows are (every ``trainer.log_every_n_steps`` batches that stepped) the
fractions of the time since the last row are logged as
``step_time/data_wait``, ``step_time/forward_backward``, ``step_time/optimizer``,
``step_time/comm_unhidden``, ``step_time/other``, with ``step_time/total_ms`` (TensorBoard shows
them with the other metrics). ``summary()`` gives medians over the steps measured so far.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from typing import TYPE_CHECKING, Any

import torch

from framework.callbacks.base import Callback

if TYPE_CHECKING:
    from framework.module import TrainModule
    from framework.trainer import Trainer

#: the parts of a step, in the order they are reported
PARTS = ("data_wait", "forward_backward", "optimizer", "comm_unhidden", "other")


class CommTimer:
    """A DDP communication hook that all-reduces each bucket as DDP does and times it."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.blocked = 0.0  # time spent inside the hook (a synchronous group reduces there)
        self.first_launch: float | None = None
        self.last_return: float | None = None
        self.last_done = 0.0

    def hook(self, group, bucket):  # no annotations: DDP compares them with its own types
        import torch.distributed as dist

        start = time.perf_counter()
        if self.first_launch is None:
            self.first_launch = start
        group = group if group is not None else dist.group.WORLD
        buffer = bucket.buffer()
        buffer.mul_(1.0 / group.size())  # as DDP's built-in reduction scales (mul by 1/n, not div by n)
        future = dist.all_reduce(buffer, group=group, async_op=True).get_future()
        self.last_return = end = time.perf_counter()
        self.blocked += end - start

        def done(fut: torch.futures.Future) -> torch.Tensor:
            self.last_done = max(self.last_done, time.perf_counter())
            return fut.value()[0]

        return future.then(done)

    def take(self, backward_end: float) -> tuple[float, float]:
        """(unhidden, span) of the all-reduces since the last call, seconds; then reset."""
        if self.last_return is None or self.first_launch is None:  # no all-reduce (one process, or no_sync)
            return 0.0, 0.0
        unhidden = self.blocked + max(0.0, backward_end - self.last_return)
        span = max(self.last_done, backward_end) - self.first_launch
        self.reset()
        return unhidden, span


class StepTimeBreakdown(Callback):
    """Split each training step's wall time into data wait, forward+backward, optimizer and
    unhidden communication; log the fractions and keep per-step samples.

    Args:
        comm: time DDP's gradient all-reduce with a communication hook (see the module doc).
        synchronize: synchronise CUDA at each reading (default: when training on CUDA).
        log: log the fractions of the batches since the last row where ``self.log``'s step rows
            are (every ``trainer.log_every_n_steps`` batches that stepped), at their step.
        keep: how many recent steps ``steps`` keeps for ``summary()``.
    """

    def __init__(self, comm: bool = True, synchronize: bool | None = None, log: bool = True,
                 keep: int = 100_000) -> None:
        self.comm, self.synchronize, self.log = comm, synchronize, log
        self.steps: deque[dict[str, float]] = deque(maxlen=keep)
        self.timer: CommTimer | None = None
        self._sync = torch.cuda.synchronize if synchronize and torch.cuda.is_available() else _no_sync
        self._window: list[dict[str, float]] = []
        self._clear()

    def _clear(self) -> None:
        self._previous_end: float | None = None
        self._start = self._backward_start = self._backward_end = 0.0

    # -- hooks ----------------------------------------------------------------------------
    def on_train_start(self, trainer: Trainer, module: TrainModule) -> None:
        device = getattr(getattr(trainer, "strategy", None), "root_device", None) or getattr(module, "device", None)
        sync = self.synchronize if self.synchronize is not None else getattr(device, "type", "cpu") == "cuda"
        self._sync = torch.cuda.synchronize if sync and torch.cuda.is_available() else _no_sync
        if self.comm:
            self.attach(getattr(trainer.strategy, "model", None))

    def attach(self, model: Any) -> bool:
        """Time ``model``'s gradient all-reduce (a DDP model without a hook of its own)."""
        from torch.nn.parallel import DistributedDataParallel

        if not isinstance(model, DistributedDataParallel) or getattr(model, "_comm_hooks", None):
            return False
        self.timer = CommTimer()
        model.register_comm_hook(getattr(model, "process_group", None), self.timer.hook)
        return True

    def on_train_epoch_start(self, trainer: Trainer, module: TrainModule) -> None:
        self.mark_epoch_start()

    def on_train_batch_start(self, trainer: Trainer, module: TrainModule, batch: Any, batch_idx: int) -> None:
        self.mark_batch_start()

    def on_before_backward(self, trainer: Trainer, module: TrainModule, loss: torch.Tensor) -> None:
        self.mark_backward_start()

    def on_after_backward(self, trainer: Trainer, module: TrainModule) -> None:
        self.mark_backward_end()

    def on_train_batch_end(self, trainer: Trainer, module: TrainModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self.mark_batch_end()
        if self.log and self._window and trainer.state.log_due:  # the steps self.log's rows land on
            trainer.log_metrics(self.fractions(self._window), step=trainer.state.logger_step)
            self._window = []

    # -- the clock (a hand-written loop may call these itself) ------------------------------
    def mark_epoch_start(self) -> None:
        self._sync()
        self._previous_end = time.perf_counter()

    def mark_batch_start(self) -> None:
        self._sync()
        self._start = self._backward_start = self._backward_end = time.perf_counter()
        if self._previous_end is None:
            self._previous_end = self._start

    def mark_backward_start(self) -> None:
        self._backward_start = time.perf_counter()

    def mark_backward_end(self) -> None:
        self._sync()
        self._backward_end = time.perf_counter()

    def mark_batch_end(self) -> None:
        self._sync()
        end = time.perf_counter()
        assert self._previous_end is not None, "mark_batch_start comes first"
        unhidden, span = self.timer.take(self._backward_end) if self.timer is not None else (0.0, 0.0)
        total = end - self._previous_end
        step = {
            "total": total,
            "data_wait": self._start - self._previous_end,
            "forward_backward": max(0.0, self._backward_end - self._start - unhidden),
            "optimizer": end - self._backward_end,
            "comm_unhidden": unhidden,
            "comm_span": span,
        }
        step["other"] = max(0.0, total - sum(step[p] for p in PARTS[:-1]))
        self.steps.append(step)
        self._window.append(step)
        self._previous_end = end

    # -- results --------------------------------------------------------------------------
    @staticmethod
    def fractions(steps: list[dict[str, float]]) -> dict[str, float]:
        """Each part's share of the steps' total time, and the mean step time in ms."""
        total = sum(s["total"] for s in steps) or float("nan")
        out = {f"step_time/{p}": sum(s[p] for s in steps) / total for p in PARTS}
        out["step_time/total_ms"] = total / len(steps) * 1e3
        return out

    def summary(self, skip: int = 0) -> dict[str, Any]:
        """Medians (seconds) of each part over the kept steps after the first ``skip``."""
        steps = list(self.steps)[skip:]
        if not steps:
            return {"steps": 0}
        keys = ("total", *PARTS, "comm_span")
        return {"steps": len(steps), **{k: statistics.median(s[k] for s in steps) for k in keys}}


def _no_sync() -> None:
    return None
