"""The batch-size search behind ``Tuner.scale_batch_size``, trial for trial Lightning's.

Each trial is one ``Trials.call`` of ``steps_per_trial`` steps (a fit: that many
optimizer steps on all the training batches, validation on as many batches; validate, test,
predict: that many batches) with the batch size set on the module or DataModule, whose
``*_dataloader()`` builds the loaders anew for each call. A trial that runs out of memory
(``torch.OutOfMemoryError``, or the messages Lightning's ``is_oom_error`` reads: CUDA out of
memory, cuDNN's NOT_SUPPORTED, the CPU allocator's) fails; any other error ends the search.
The weights go on from trial to trial, as in Lightning, and are put back at the end; each trial
makes its optimizer anew (Lightning's go on with one), and a failed trial is a failed call: the
DataModule's ``on_exception`` sees its error (Lightning's finder catches it before).

- ``power``: double the size after each trial that fits; after one that does not, halve it and
  stop (or, before any trial fitted, go on from the half).
- ``binsearch``: double until a trial does not fit, then bisect between the largest size that
  fitted and the smallest that did not; the result is then reduced by ``margin``.

Both stop when a size reaches the data set's length (a larger one gives the same batches), at
``max_val``, or after ``max_trials`` trials. Where fw deliberately differs from Lightning 2.6,
only where Lightning's trials are not what its search assumes:

- a size that ran out of memory always goes down (Lightning keeps it when it is not below the
  data set's length, and returns it in ``power`` mode, or tries it again without end in
  ``binsearch``);
- ``max_val`` caps ``power`` mode too (Lightning's can return twice it), and a size capped at
  ``max_val`` is tried before it is returned (Lightning returns it untried);
- the first trial of a fit runs ``init_val`` (Lightning's runs the loader it built before it set
  ``init_val``, at the size the module had, and counts it as a trial of ``init_val``).
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable, Sized
from typing import TYPE_CHECKING

import torch

from framework.callbacks.base import Callback
from framework.errors import TrainingError
from framework.rank_zero import rank_zero_info

if TYPE_CHECKING:
    from framework.module import TrainModule
    from framework.trainer import Trainer
    from framework.tuner.attributes import TunedValue

MODES = ("power", "binsearch")

#: what Lightning's ``is_oom_error`` recognises in a RuntimeError's one argument
_OOM_MESSAGES = (("CUDA", "out of memory"), ("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",),
                 ("DefaultCPUAllocator: can't allocate memory",))


def is_out_of_memory(exc: BaseException) -> bool:
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    if not isinstance(exc, RuntimeError) or len(exc.args) != 1 or not isinstance(exc.args[0], str):
        return False
    return any(all(part in exc.args[0] for part in parts) for parts in _OOM_MESSAGES)


def free_memory(cpu_ran_out: bool = False) -> None:
    """Collect what earlier trials left (a failed one's tensors and frames, a finished one's
    optimizer state in reference cycles) and give the CUDA cache back, as Lightning's
    ``garbage_collection_cuda`` does before each trial. Only where that memory is: with CUDA in
    use, or after the CPU allocator failed (a full collection costs a fraction of a second)."""
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    if cuda or cpu_ran_out:
        gc.collect()
    if cuda:
        torch.cuda.empty_cache()


class DatasetLength(Callback):
    """Reads the length of the data set the call runs on (Lightning's ``_dataset_length``:
    that of the loader's ``dataset``, None for an iterable one)."""

    def __init__(self, stage: str) -> None:
        self.stage = stage
        self.length: int | None = None
        self.loaders = 0

    def _read(self, trainer: Trainer, module: TrainModule) -> None:
        run = trainer.run
        loaders = (run.loaders.get(self.stage) if run is not None else None) or []
        self.loaders = len(loaders)
        lengths = [len(ds) for ds in (getattr(loader, "dataset", None) for loader in loaders) if isinstance(ds, Sized)]
        self.length = max(lengths) if lengths else None

    def on_fit_start(self, trainer: Trainer, module: TrainModule) -> None:
        self._read(trainer, module)

    def on_validation_start(self, trainer: Trainer, module: TrainModule) -> None:
        if self.stage == "validate":
            self._read(trainer, module)

    on_test_start = on_predict_start = _read


class BatchSizeSearch:
    """The search over ``value`` (the batch size), running ``trial()`` (True: it fitted)."""

    def __init__(self, value: TunedValue, trial: Callable[[], bool], length: int | None, max_val: int) -> None:
        self.value, self.trial, self.length, self.max_val = value, trial, length, max_val

    def set_up(self, init_val: int) -> int:
        """The first size: ``init_val``, unless the size set already covers the data set."""
        return self._grow(value=init_val)[0]

    def power(self, size: int, max_trials: int) -> int:
        any_success = False
        for i in range(max_trials):
            if not self.trial():
                size = self._shrink(size // 2)
                if any_success:
                    break
                continue
            if i + 1 >= max_trials:
                break
            size, changed = self._grow(factor=2, desc="succeeded")
            if not changed:
                break
            any_success = True
        return size

    def binsearch(self, size: int, max_trials: int, margin: float) -> int:
        low, high, count = 1, None, 0
        while True:
            if not self.trial():
                high = size
                size = self._shrink((high + low) // 2)
                if high - low <= 1:
                    break
                continue
            count += 1
            if count >= max_trials:
                break
            low = size
            if high is not None and high - low <= 1:
                break
            size, changed = (self._grow(value=(high + low) // 2, desc="succeeded") if high is not None
                             else self._grow(factor=2, desc="succeeded"))
            if not changed:
                break
        reduced = max(1, int(size * (1 - margin))) if margin > 0 else size
        if reduced != size:
            rank_zero_info(f"fw scale_batch_size: applying margin of {margin:.1%}, reducing batch size from {size} to "
                           f"{reduced}")
            self.value.set(reduced)
        return reduced

    def _grow(self, factor: float = 1.0, value: int | None = None, desc: str | None = None) -> tuple[int, bool]:
        """Lightning's ``_adjust_batch_size``: the next size, and whether it changed (not when the
        current size already covers the data set, or is ``max_val`` already)."""
        size = int(self.value.get())
        if self.length is not None and size >= self.length:
            rank_zero_info(f"fw scale_batch_size: the batch size {size} is greater or equal than the length of the "
                           f"data set: {self.length}")
            return size, False
        new = value if value is not None else int(size * factor)
        if new > self.max_val:
            rank_zero_info(f"fw scale_batch_size: batch size {new} exceeds max_val {self.max_val}, capping it")
            new = self.max_val
        if desc:
            rank_zero_info(f"fw scale_batch_size: batch size {size} {desc}, trying batch size {new}")
        self.value.set(new)
        return new, new != size

    def _shrink(self, new: int) -> int:
        size = int(self.value.get())
        if new < 1:
            raise TrainingError(f"scale_batch_size: batch size {size} runs out of memory and there is no smaller one "
                                "to try: make the model or its inputs smaller, or use lower precision")
        rank_zero_info(f"fw scale_batch_size: batch size {size} failed (out of memory), trying batch size {new}")
        self.value.set(new)
        return new


def trial_fn(run_trial: Callable[[], None]) -> Callable[[], bool]:
    """``run_trial`` as a trial: True when it fitted in memory, False when it ran out; any other
    error goes on up."""
    def trial() -> bool:
        error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
        existed = error_file is not None and os.path.exists(error_file)
        free_memory()
        try:
            run_trial()
            return True
        except RuntimeError as exc:
            if not is_out_of_memory(exc):
                raise
            cpu = "DefaultCPUAllocator" in str(exc)
        # the Trainer recorded the error for the elastic agent; the search has dealt with it
        if error_file is not None and not existed and os.path.exists(error_file):
            os.remove(error_file)
        free_memory(cpu_ran_out=cpu)
        return False

    return trial
