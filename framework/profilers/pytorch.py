"""``PyTorchProfiler``: ``torch.profiler`` around the run (Lightning's ``PyTorchProfiler``).

The profiler starts with the run's first action; every action is a ``record_function`` range
named ``[pl][profile]{action}`` (``[pl][profile][Strategy]SingleDeviceStrategy.training_step``),
and with ``record_module_names`` every submodule's forward a ``[pl][module]...`` range. Each
``*_step`` action steps the schedule (default ``wait=1, warmup=1, active=3``, counted per kind
of step; with fewer than 5 steps of a kind, everything is recorded). A finished recording is
written as a Chrome trace, ``{dirpath}/{stage}[-{filename}][-{local_rank}]-{action}.*.pt.trace.json``
(open it in ``chrome://tracing`` or Perfetto; ``dirpath`` defaults to the run folder). At the
end of the run the report is the operator table of ``key_averages()``.
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any, ClassVar

import torch

from framework.errors import ConfigError
from framework.profilers.profiler import Profiler
from framework.profilers.pytorch_schedule import STEP_KINDS, RegisterRecordFunction, ScheduleWrapper

AVAILABLE_SORT_KEYS = {"cpu_time", "cuda_time", "cpu_time_total", "cuda_time_total", "cpu_memory_usage",
                       "cuda_memory_usage", "self_cpu_memory_usage", "self_cuda_memory_usage", "count"}


def _default_schedule() -> Any:
    return torch.profiler.schedule(wait=1, warmup=1, active=3)


class PyTorchProfiler(Profiler):
    """Operator-level profiling with ``torch.profiler`` (CPU, and CUDA when it is there).

    Args:
        dirpath, filename: where the report and the traces go (see ``Profiler``).
        group_by_input_shapes: group the table by operator input shapes (needs ``record_shapes=True``).
        emit_nvtx: emit NVTX ranges for ``nvprof``/Nsight instead of recording (CUDA; no report).
        export_to_chrome: write each finished recording as a Chrome trace (``.pt.trace.json``).
        row_limit: rows of the report's table (-1: all).
        sort_by_key: the table's order (``cpu_time_total`` or, with CUDA, ``cuda_time_total``).
        record_module_names: a range per submodule forward, named after the submodule.
        table_kwargs: more keyword arguments of ``EventList.table``.
        **profiler_kwargs: keyword arguments of ``torch.profiler.profile`` (``schedule``,
            ``activities``, ``record_shapes``, ``profile_memory``, ``with_stack``, ...;
            ``export_to_flame_graph=True`` writes ``.stack`` files).

    Raises:
        ConfigError: a sort key, schedule or table argument that torch would not take.
    """

    STEP_FUNCTIONS: ClassVar[set[str]] = set(STEP_KINDS)
    AVAILABLE_SORT_KEYS = AVAILABLE_SORT_KEYS

    def __init__(self, dirpath: str | Path | None = None, filename: str | None = None,
                 group_by_input_shapes: bool = False, emit_nvtx: bool = False, export_to_chrome: bool = True,
                 row_limit: int = 20, sort_by_key: str | None = None, record_module_names: bool = True,
                 table_kwargs: dict[str, Any] | None = None, **profiler_kwargs: Any) -> None:
        if not torch.profiler.kineto_available():
            raise ConfigError("PyTorchProfiler needs a torch built with Kineto (torch.profiler.kineto_available())")
        self._sort_by_key = sort_by_key or _default_sort_by_key(profiler_kwargs)
        if self._sort_by_key not in AVAILABLE_SORT_KEYS:
            raise ConfigError(f"PyTorchProfiler(sort_by_key={self._sort_by_key!r}): use one of "
                              f"{', '.join(sorted(AVAILABLE_SORT_KEYS))}")
        self._table_kwargs = dict(table_kwargs or {})
        _check_table_kwargs(self._table_kwargs)
        schedule = profiler_kwargs.get("schedule", _default_schedule())
        _check_schedule(schedule)
        super().__init__(dirpath=dirpath, filename=filename)
        self._group_by_input_shapes = group_by_input_shapes and profiler_kwargs.get("record_shapes", False)
        self._emit_nvtx, self._export_to_chrome, self._row_limit = emit_nvtx, export_to_chrome, row_limit
        self._record_module_names = record_module_names
        self._export_to_flame_graph = bool(profiler_kwargs.pop("export_to_flame_graph", False))
        self._metric = profiler_kwargs.pop("metric", "self_cpu_time_total")
        self._has_on_trace_ready = "on_trace_ready" in profiler_kwargs
        self._uses_default_schedule = "schedule" not in profiler_kwargs
        self._wrapper = ScheduleWrapper(schedule)
        #: the schedule while it counts steps; None once a run records every step (put back after it)
        self._schedule: ScheduleWrapper | None = self._wrapper
        profiler_kwargs["schedule"] = self._wrapper
        profiler_kwargs["activities"] = profiler_kwargs.get("activities") or _default_activities()
        profiler_kwargs["with_stack"] = profiler_kwargs.get("with_stack", False) or self._export_to_flame_graph
        self._profiler_kwargs = profiler_kwargs
        self.profiler: Any = None
        self.function_events: Any = None
        self._parent_profiler: Any = None
        self._register: RegisterRecordFunction | None = None
        self._recording_map: dict[str, Any] = {}
        self._warned = False

    # -- recording ------------------------------------------------------------------------------
    def start(self, action_name: str) -> None:
        if self.profiler is None:
            if torch.autograd._profiler_enabled():  # one left open by another profiler that never described
                torch.autograd._disable_profiler()
            self._create_profilers()
        if self._lightning_module is not None and self._register is None and self._record_module_names:
            self._register = RegisterRecordFunction(self._lightning_module)
            self._register.__enter__()
        if self.profiler is not None and action_name not in self._recording_map:
            recording = torch.autograd.profiler.record_function("[pl][profile]" + action_name)
            recording.__enter__()
            self._recording_map[action_name] = recording

    def stop(self, action_name: str) -> None:
        recording = self._recording_map.pop(action_name, None)
        if recording is not None:
            recording.__exit__(None, None, None)
        if self._emit_nvtx or self.profiler is None or not any(action_name.endswith(f) for f in STEP_KINDS):
            return
        if self._schedule is not None:
            self._schedule.pre_step(action_name)
        if self._should_record_everything():
            self._schedule = None  # too few steps for wait/warmup/active: record them all
            self.profiler.schedule = torch.profiler.profiler._default_schedule_fn
            self._warn_once("PyTorchProfiler: fewer than 5 steps of this kind, too few for the default schedule "
                            "(wait 1, warmup 1, active 3): every step is recorded instead")
        if not self._has_on_trace_ready:
            self.profiler.on_trace_ready = lambda profiler: self._export(profiler, action_name)
        if self._schedule is not None:
            self.profiler.step_num = self._schedule.num_step
        self.profiler.step()
        self.profiler.add_metadata("Framework", "fw")

    def _writes_files(self) -> bool:
        return bool(self.filename) or not self._has_on_trace_ready  # its traces, unless on_trace_ready takes them

    def _export(self, profiler: Any, action_name: str) -> None:
        """A finished recording: its Chrome trace (and flame-graph stacks) in ``dirpath``."""
        if self.dirpath is None:
            from framework.rank_zero import rank_zero_warn

            rank_zero_warn("PyTorchProfiler could not write its trace: no dirpath (give one, or run it in a Trainer)")
            return
        dirpath = str(self.dirpath)
        if self._export_to_chrome:
            name = self._prepare_filename(action_name=action_name, extension="")
            torch.profiler.tensorboard_trace_handler(dirpath, name)(profiler)
        if self._export_to_flame_graph:
            profiler.export_stacks(os.path.join(dirpath, self._prepare_filename(action_name=action_name,
                                                                                extension=".stack")), self._metric)

    def _should_record_everything(self) -> bool:
        """Lightning's rule: the default schedule needs 5 steps; with fewer of this kind in the
        run, record every step instead (torch would otherwise never finish a recording)."""
        if self._schedule is None or not self._uses_default_schedule or self._lightning_module is None:
            return False
        trainer = getattr(self._lightning_module, "_trainer", None)
        return trainer is not None and _total_steps(trainer, self._schedule) < 5

    def _warn_once(self, message: str) -> None:
        if not self._warned:
            from framework.rank_zero import rank_zero_warn

            self._warned = True
            rank_zero_warn(message)

    # -- the report -----------------------------------------------------------------------------
    def summary(self) -> str:
        if not self._profiler_kwargs.get("enabled", True) or self._emit_nvtx:
            return ""
        self._delete_profilers()
        if not self.function_events:
            return ""
        data = self.function_events.key_averages(group_by_input_shapes=self._group_by_input_shapes)
        table = data.table(sort_by=self._sort_by_key, row_limit=self._row_limit, **self._table_kwargs)
        return self._stats_to_str({"records": table})

    # -- the torch profilers' lives ---------------------------------------------------------------
    def _create_profilers(self) -> None:
        if self._emit_nvtx:
            self._parent_profiler = torch.cuda.profiler.profile()
            self.profiler = _made(torch.autograd.profiler.emit_nvtx, self._profiler_kwargs)
        else:
            self.profiler = _made(torch.profiler.profile, self._profiler_kwargs)
        entered = self.profiler.__enter__()
        if entered is not None:
            self.profiler = entered
        if self._parent_profiler is not None:
            self._parent_profiler.__enter__()

    def _delete_profilers(self) -> None:
        if self.profiler is not None:
            self.profiler.__exit__(None, None, None)
            if not self._emit_nvtx and self.profiler.profiler is not None:  # None: the schedule never recorded
                self.function_events = self.profiler.events()
            self.profiler = None
        self._wrapper.reset()
        self._schedule = self._wrapper  # the next run counts its steps again (Lightning's stays off)
        if self._parent_profiler is not None:
            self._parent_profiler.__exit__(None, None, None)
            self._parent_profiler = None
        if self._register is not None:
            self._register.__exit__(None, None, None)
            self._register = None

    def teardown(self, stage: str | None) -> None:
        for recording in self._recording_map.values():
            recording.__exit__(None, None, None)
        self._recording_map = {}
        self._delete_profilers()
        super().teardown(stage=stage)

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()  # torch's profilers and ranges stay in this process
        state.update(profiler=None, function_events=None, _parent_profiler=None, _register=None, _recording_map={})
        return state


def _made(cls: Any, kwargs: dict[str, Any]) -> Any:
    """``cls`` with the keyword arguments it takes."""
    accepted = inspect.signature(cls.__init__).parameters
    return cls(**{key: value for key, value in kwargs.items() if key in accepted})


def _total_steps(trainer: Any, schedule: ScheduleWrapper) -> float:
    """Steps of the schedule's current kind in this run, from the Trainer's batch counts."""
    kind = schedule._kind
    if kind == "training_step":
        return trainer.num_training_batches
    if kind == "validation_step":
        return sum(trainer.num_val_batches) + sum(trainer.num_sanity_val_batches)
    if kind == "test_step":
        return sum(trainer.num_test_batches)
    return sum(trainer.num_predict_batches)


def _default_activities() -> list[Any]:
    from torch.profiler import ProfilerActivity

    return [ProfilerActivity.CPU, ProfilerActivity.CUDA] if torch.cuda.is_available() else [ProfilerActivity.CPU]


def _default_sort_by_key(profiler_kwargs: dict[str, Any]) -> str:
    from torch.profiler import ProfilerActivity

    activities = profiler_kwargs.get("activities") or []
    cuda = ProfilerActivity.CUDA in activities or (not activities and torch.cuda.is_available())
    return "cuda_time_total" if cuda else "cpu_time_total"


def _check_schedule(schedule: Any) -> None:
    from torch.profiler import ProfilerAction

    if not callable(schedule):
        raise ConfigError(f"PyTorchProfiler(schedule={schedule!r}): give a callable, e.g. torch.profiler.schedule(...)")
    if not isinstance(schedule(0), ProfilerAction):
        raise ConfigError(f"PyTorchProfiler(schedule=...) returned {schedule(0)!r} for step 0, not a "
                          "torch.profiler.ProfilerAction; build it with torch.profiler.schedule(...)")


def _check_table_kwargs(table_kwargs: dict[str, Any]) -> None:
    from torch.autograd.profiler_util import EventList

    valid = set(inspect.signature(EventList.table).parameters) - {"self", "sort_by", "row_limit"}
    for key in table_kwargs:
        if key in ("sort_by", "row_limit"):
            raise ConfigError(f"PyTorchProfiler(table_kwargs={{{key!r}: ...}}): give {key} as the profiler's own "
                              "argument (sort_by_key=, row_limit=)")
        if key not in valid:
            raise ConfigError(f"PyTorchProfiler(table_kwargs={{{key!r}: ...}}): EventList.table takes "
                              f"{', '.join(sorted(valid))}")
