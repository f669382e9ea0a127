"""Where a rank is stuck in the user's code: its main thread's stack down to the user's own line.

A hang report (``trainer/heartbeat.py``, the MPI group's watchdog in ``strategies/mpi/``) names
the line a rank is in: ``job.py:42 time.sleep(600) in training_step``. The *user's frame* is
the innermost frame of a stack whose file is neither fw's, nor the standard library's, nor an
installed package's (torch, ...); its code is read with ``linecache``.

- The main thread's stack is read from another thread (``sys._current_frames``): ``main_thread``.
  Where the main thread waits in ``torch.distributed`` (a collective the user called), the
  line says which call. Some 15 microseconds of CPU for a stack of 45 frames (the heartbeat
  computes it at every beat, every few seconds).
- A DataLoader worker is a process of its own, whose stack no other process can read. fw gives
  each worker of a distributed run's loaders an init function (``DumpsStack``, run before the
  user's own ``worker_init_fn``) that registers ``faulthandler`` for a real-time signal
  (``SIGRTMIN+6``), writing the worker's stack to a file of its own. When the main thread waits
  for a batch, ``main_thread(workers=True)`` sends that signal to the worker the batch is due
  from and reads what it wrote. faulthandler writes from its C signal handler, without the GIL,
  so a worker stuck in C code answers as well as one in Python (a Python signal handler would
  run only once the worker is back in the interpreter). A worker that has not registered (still
  starting) is never signalled: the signal's default action would end it; its /proc status says
  whether it catches the signal.
"""

from __future__ import annotations

import atexit
import faulthandler
import linecache
import os
import re
import shutil
import signal
import site
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any, TextIO

#: the signal a loader worker dumps its stack on (real-time: no library or user handler expects it)
WORKER_SIGNAL = signal.SIGRTMIN + 6
_CODE_CHARS = 80  # a longer line of code is cut


@dataclass(frozen=True)
class Stuck:
    """Where a thread is: ``line``, the user's line (``job.py:42 time.sleep(600) in
    training_step``, with the worker or the torch.distributed call it waits in), or None when no
    frame of the user's is on the stack; ``waiting`` is true where it waits for the other ranks
    in a ``torch.distributed`` call."""

    line: str | None
    waiting: bool = False


def main_thread(workers: bool = False) -> Stuck:
    """Where the main thread is (see ``Stuck``). With ``workers``, a main thread that waits for a
    batch from a loader worker asks that worker for its stack: a signal, and a wait of at most a
    quarter of a second (faulthandler answers within milliseconds; a heartbeat must not fall a
    beat behind)."""
    frame = sys._current_frames().get(threading.main_thread().ident or -1)
    try:
        return Stuck(None) if frame is None else where(frame, workers)
    except Exception:  # the callers' threads (a heartbeat, a watchdog) must live on: no line then
        return Stuck(None)
    finally:
        del frame  # no reference cycle through the main thread's frames


def where(frame: FrameType, workers: bool = False) -> Stuck:
    """Where the stack whose innermost frame is ``frame`` is (see ``main_thread``)."""
    collective = None
    f: FrameType | None = frame
    while f is not None:
        path = f.f_code.co_filename
        if _is_user(path):
            if not _called_by_fw(f):  # the script's own call of fw (trainer.fit): not where it is stuck
                break
            line = describe(path, f.f_lineno, f.f_code.co_name)
            if collective is not None:
                line += f", in torch.distributed's {collective}"
            return Stuck(line, waiting=collective is not None)
        if collective is None and path.endswith(_C10D):
            collective = f.f_code.co_name
        if workers and f.f_code.co_name == "_next_data" and path.endswith(_LOADER):
            worker = _worker_line(f.f_locals.get("self"))  # the iterator: _next_data's only local so far
            if worker is not None:
                return Stuck(worker)
        f = f.f_back
    return Stuck(None, waiting=collective is not None)


def _called_by_fw(frame: FrameType) -> bool:
    """Is a frame of fw's outside ``frame`` (a hook, a loader fetch, ...)?"""
    f = frame.f_back
    while f is not None:
        if f.f_code.co_filename.startswith(_FW):
            return True
        f = f.f_back
    return False


def describe(path: str, lineno: int, function: str) -> str:
    """'job.py:42 time.sleep(600) in training_step' (the path relative to the working folder
    when it is inside it)."""
    code = linecache.getline(path, lineno).strip()
    if len(code) > _CODE_CHARS:
        code = code[: _CODE_CHARS - 3] + "..."
    short = _short(path)
    return f"{short}:{lineno} {code} in {function}" if code else f"{short}:{lineno} in {function}"


# -- whose code a frame is ----------------------------------------------------------------------
_C10D = os.path.join("torch", "distributed", "distributed_c10d.py")
_LOADER = os.path.join("torch", "utils", "data", "dataloader.py")
_USER: dict[str, bool] = {}  # file -> is it the user's (a few dozen files: each checked once)


_FW = os.path.join(os.path.dirname(os.path.abspath(__file__)), "")  # framework/


def _library_folders() -> tuple[str, ...]:
    """fw's folder, the standard library's and every site-packages folder (the environment's, the
    system's, the user's)."""
    paths = sysconfig.get_paths()
    found = [paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths]
    found += [*getattr(site, "getsitepackages", list)(), site.getusersitepackages()]
    folders = {_FW} | {os.path.abspath(f) for f in found} | {os.path.realpath(f) for f in found}
    return tuple(os.path.join(folder, "") for folder in folders)  # each ends in '/': no prefix of another name


_LIBRARY = _library_folders()


def _is_user(path: str) -> bool:
    found = _USER.get(path)
    if found is None:
        found = _USER[path] = not (path.startswith("<frozen ") or os.path.abspath(path).startswith(_LIBRARY))
    return found


def _short(path: str) -> str:
    if not os.path.isabs(path):
        return path
    here = os.path.join(os.getcwd(), "")
    return path[len(here):] if path.startswith(here) else path


# -- data-loader workers ------------------------------------------------------------------------
class DumpsStack:
    """A DataLoader ``worker_init_fn`` that makes the worker dump its stack on ``WORKER_SIGNAL``
    (see the module doc), then calls ``then`` (the loader's own init function), if any."""

    def __init__(self, then: Callable[[int], Any] | None) -> None:
        self.then, self.folder = then, _folder()

    def __call__(self, worker_id: int) -> None:
        try:
            out = open(os.path.join(self.folder, str(os.getpid())), "a")  # noqa: SIM115 (kept open: faulthandler writes to it)
            faulthandler.register(WORKER_SIGNAL, file=out, all_threads=True)
            _KEPT.append(out)
        except OSError:  # the folder is gone (the main process is ending): no stack, nothing else lost
            pass
        if self.then is not None:
            self.then(worker_id)


def dumping_stacks(loader: Any) -> Any:
    """``loader`` (a DataLoader with worker processes) with ``DumpsStack`` as its worker init
    function, in front of its own; anything else unchanged."""
    if getattr(loader, "num_workers", 0) > 0 and not isinstance(loader.worker_init_fn, DumpsStack):
        loader.worker_init_fn = DumpsStack(loader.worker_init_fn)
    return loader


_KEPT: list[TextIO] = []  # a worker's stack file, open for as long as it lives
_FOLDER: list[str] = []  # this process's folder of worker stack files, made at first use
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')


def _folder() -> str:
    if not _FOLDER:
        folder = tempfile.mkdtemp(prefix="fw-stacks-")
        atexit.register(_remove, folder, os.getpid())
        _FOLDER.append(folder)
    return _FOLDER[0]


def _remove(folder: str, owner: int) -> None:
    if os.getpid() == owner:  # not a forked worker that runs atexit's functions
        shutil.rmtree(folder, ignore_errors=True)


def _worker_line(iterator: Any) -> str | None:
    """The line of the loader worker that ``iterator`` (a multi-process DataLoader iterator)
    waits for: 'job.py:30 time.sleep(600) in __getitem__ (data loader worker 0, pid 4242)'."""
    try:
        task = iterator._task_info.get(iterator._rcvd_idx)
        if task is None or len(task) != 1:  # the batch is there already (or none is due): no worker waited for
            return None
        worker = task[0]
        pid = iterator._workers[worker].pid
    except (AttributeError, IndexError, TypeError):  # not a multi-process iterator, or another torch
        return None
    who = f"data loader worker {worker}, pid {pid}"
    line = _user_line_in(worker_stack(pid))
    return f"{line} ({who})" if line else f"waiting for {who}"


def worker_stack(pid: int, wait_s: float = 0.25) -> str:
    """What the loader worker ``pid`` dumps on ``WORKER_SIGNAL`` (faulthandler's text), or ''
    when it cannot say (not set up by ``DumpsStack``, gone, or silent for ``wait_s``)."""
    if not _FOLDER or not _catches(pid, WORKER_SIGNAL):
        return ""
    path = os.path.join(_FOLDER[0], str(pid))
    try:
        os.truncate(path, 0)  # the worker appends: it writes from the start again
        os.kill(pid, WORKER_SIGNAL)
    except OSError:
        return ""
    text, end = "", time.monotonic() + wait_s
    while time.monotonic() < end:
        time.sleep(0.02)
        try:
            with open(path) as f:
                now = f.read()
        except OSError:
            return ""
        if now and now == text:  # written, and no more came for a moment: done
            return text
        text = now
    return text


def _catches(pid: int, signum: int) -> bool:
    """Does process ``pid`` handle ``signum`` (/proc/pid/status's SigCgt mask)?"""
    try:
        with open(f"/proc/{pid}/status") as f:
            for row in f:
                if row.startswith("SigCgt:"):
                    return bool(int(row.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError):
        pass
    return False


def _user_line_in(dump: str) -> str | None:
    """The user's line in faulthandler's dump of a worker's threads: that of the thread in
    torch's worker loop (the worker's main thread), else of the last one dumped (the oldest
    thread: faulthandler dumps the newest first)."""
    threads = [block.splitlines() for block in dump.split("\n\n") if block.strip()]
    frames = [[m.groups() for m in map(_FRAME.match, block) if m] for block in threads]
    frames = [stack for stack in frames if stack]
    if not frames:
        return None
    stack = next((s for s in frames if any(name == "_worker_loop" for _, _, name in s)), frames[-1])
    for path, lineno, function in stack:  # innermost first
        if _is_user(path):
            return describe(path, int(lineno), function.strip())
    return None
