"""Guards that every test runs under: a test leaves the process as it found it.

After each test (its function and function-scoped fixtures), ``leak_guard`` in conftest.py fails
it, naming what leaked, when it left behind

- a thread it started that is still alive after a short grace: a non-daemon thread (it would keep
  the interpreter from exiting), or one of fw's own (``fw-*``, daemon or not: a heartbeat or an
  MPI watchdog that outlives its run is a bug);
- a handler of SIGTERM, SIGINT, SIGUSR1, SIGUSR2 or SIGHUP that it did not restore, or one of
  these blocked (or unblocked) in the main thread's signal mask: every process a later test
  starts inherits the mask (a worker with SIGUSR1 blocked, resumed by fw's launcher, never acted
  on it: a test that failed in CI after another had run in the same pytest worker);
- an environment variable added, changed or removed (``monkeypatch`` restores its own);
- an initialized ``torch.distributed`` default process group, or the native threads of one (Gloo's,
  a TCPStore's) still running after it was destroyed: something still holds the group (DTensor's
  caches hold a sharded run's mesh, and its groups, for the life of the process), and a copy
  forked from this process later inherits the group without its threads (a forked rank that
  crashed with exit -11 in CI, after such a test had run in the same pytest worker);
- a process it started without the ``procs`` mark (which would make the fast tier slow), or a
  cluster job (``srun``, ``sbatch``, network namespaces) without the ``cluster`` mark;
- a file or folder it added to the repository (a test writes into its ``tmp_path``; a run's
  ``fw_logs/`` left in the checkout by ``fw fit ... trainer.default_root_dir=.`` was one), outside
  the caches that appear there by design (``REPO_CACHES``). Under ``pytest -n`` the test each other
  worker runs at that moment sees the new name too, so the writer fails together with those; the
  message says so (``pytest -n0`` on the named tests tells which).

Each check costs microseconds (the repository's 0.4 ms: one ``stat`` for each of its 51 folders
on this machine's overlay file system); a guard that fails also restores what it can (variables,
handlers, the signal mask, the process group) so that one leak is reported once, not again by every
test after it. What a test wrote into the repository is named, not deleted (a file a developer
saves there meanwhile would go too), and named once: the next check starts from what is there.
"""

from __future__ import annotations

import collections
import functools
import multiprocessing.process
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch.distributed as dist

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP)
#: variables that pytest, or a library once per process, sets for itself: torch at its first CUDA or
#: inductor use, Lightning and scikit-learn when first imported (a test that comes first would be blamed)
IGNORED_VARIABLES = {"PYTEST_CURRENT_TEST", "CUDA_MODULE_LOADING", "TORCHINDUCTOR_CACHE_DIR",
                     "PYTORCH_NVML_BASED_CUDA_CHECK", "KMP_DUPLICATE_LIB_OK", "KMP_INIT_AT_FORK"}
THREAD_GRACE_S = 2.0
#: commands that start a job on a cluster (or build one): they need the ``cluster`` mark
CLUSTER_COMMANDS = {"srun", "sbatch", "salloc"}
#: system tools that fw itself asks, in milliseconds (``scontrol show hostnames``, ``ip -o -4 addr``):
#: not what the ``procs`` mark is about (interpreters and launchers, seconds each)
QUICK_TOOLS = {"scontrol", "ip", "uname"}


@dataclass
class Snapshot:
    threads: set[threading.Thread] = field(default_factory=lambda: set(threading.enumerate()))
    handlers: dict[int, object] = field(default_factory=lambda: {s: signal.getsignal(s) for s in SIGNALS})
    blocked: set[int] = field(default_factory=lambda: _blocked())
    environ: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    native: collections.Counter[str] = field(default_factory=lambda: _native_group_threads())


def leaks(before: Snapshot) -> list[str]:
    """What changed since ``before``, one line each; variables, handlers, the signal mask and the
    process group are put back."""
    return [*_threads(before), *_handlers(before), *_mask(before), *_environ(before), *_process_group(),
            *_native(before)]


def _threads(before: Snapshot) -> list[str]:
    suspects = [t for t in threading.enumerate()
                if t not in before.threads and (not t.daemon or t.name.startswith("fw-"))]
    deadline = time.monotonic() + THREAD_GRACE_S
    for thread in suspects:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    return [f"thread {t.name!r} ({'daemon' if t.daemon else 'non-daemon'}) still alive "
            f"{THREAD_GRACE_S:g} s after the test" for t in suspects if t.is_alive()]


def _handlers(before: Snapshot) -> list[str]:
    found = []
    for signum, handler in before.handlers.items():
        now = signal.getsignal(signum)
        if now != handler:
            found.append(f"handler of {signal.Signals(signum).name} not restored: {handler!r} -> {now!r}")
            signal.signal(signum, handler)  # type: ignore[arg-type]
    return found


def _blocked() -> set[int]:
    """Which of ``SIGNALS`` the calling thread (the main one, in a test) blocks."""
    return set(signal.pthread_sigmask(signal.SIG_BLOCK, [])) & set(SIGNALS)


def _mask(before: Snapshot) -> list[str]:
    now = _blocked()
    if now == before.blocked:
        return []
    blocked, unblocked = now - before.blocked, before.blocked - now
    signal.pthread_sigmask(signal.SIG_UNBLOCK, blocked)
    signal.pthread_sigmask(signal.SIG_BLOCK, unblocked)
    return [f"signal mask not restored: blocked {_names(blocked)}, unblocked {_names(unblocked)}"]


def _names(signals: set[int]) -> str:
    return ", ".join(sorted(signal.Signals(s).name for s in signals)) or "none"


def _environ(before: Snapshot) -> list[str]:
    found = []
    now = dict(os.environ)
    for key in sorted((set(before.environ) | set(now)) - IGNORED_VARIABLES):
        old, new = before.environ.get(key), now.get(key)
        if old == new:
            continue
        if old is None:
            found.append(f"environment variable {key} added ({new!r})")
            del os.environ[key]
        elif new is None:
            found.append(f"environment variable {key} removed (was {old!r})")
            os.environ[key] = old
        else:
            found.append(f"environment variable {key} changed ({old!r} -> {new!r})")
            os.environ[key] = old
    return found


def _process_group() -> list[str]:
    if not (dist.is_available() and dist.is_initialized()):
        return []
    backend = dist.get_backend()
    dist.destroy_process_group()
    return [f"torch.distributed default process group ({backend}) still initialized"]


#: the names (``/proc/self/task/*/comm``) of the threads that a Gloo process group and a TCPStore run
NATIVE_GROUP_THREADS = ("gloo_", "pt_gloo", "pt_tcpstore")


def _native_group_threads() -> collections.Counter[str]:
    names: collections.Counter[str] = collections.Counter()
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                name = f.read().strip()
        except OSError:  # the thread ended meanwhile
            continue
        if name.startswith(NATIVE_GROUP_THREADS):
            names[name] += 1
    return names


def _native(before: Snapshot) -> list[str]:
    deadline = time.monotonic() + THREAD_GRACE_S
    while (new := _native_group_threads() - before.native) and time.monotonic() < deadline:
        time.sleep(0.05)
    if not new:
        return []
    names = ", ".join(f"{name} x{count}" for name, count in sorted(new.items()))
    return [f"native threads of a process group or store still running {THREAD_GRACE_S:g} s after the test "
            f"({names}): something holds the group (a sharded run in this process: run it in a forked copy)"]


# --- processes: a test that starts one must be marked for it ------------------------------------


@dataclass
class Starts:
    """The processes started since the current test's setup began, that its marks do not allow."""

    may_start: bool = True  # outside a test (collection, plugins): anything goes
    may_run_jobs: bool = True
    unmarked: list[str] = field(default_factory=list)

    def begin(self, item: pytest.Item) -> None:
        self.may_run_jobs = item.get_closest_marker("cluster") is not None
        self.may_start = self.may_run_jobs or item.get_closest_marker("procs") is not None
        self.unmarked = []

    def note(self, what: str, argv: list[str]) -> None:
        if not self.may_start and not _is_quick_tool(argv):
            self.unmarked.append(f"{what} {_shorten(argv)} started, but the test is not marked procs")
        elif not self.may_run_jobs and _is_cluster_job(argv):
            self.unmarked.append(f"{what} {_shorten(argv)} started, but the test is not marked cluster")

    def take(self) -> list[str]:
        found, self.unmarked = self.unmarked, []
        return found


STARTS = Starts()


def _is_cluster_job(argv: list[str]) -> bool:
    program = os.path.basename(argv[0]) if argv else ""
    return program in CLUSTER_COMMANDS or argv[:2] == ["ip", "netns"]


def _is_quick_tool(argv: list[str]) -> bool:
    return bool(argv) and os.path.basename(argv[0]) in QUICK_TOOLS and not _is_cluster_job(argv)


def _shorten(argv: list[str]) -> str:
    text = " ".join(argv)
    return repr(text if len(text) <= 120 else text[:117] + "...")


def _argv(args: object) -> list[str]:
    if isinstance(args, (str, bytes, os.PathLike)):  # a shell command, or a program without arguments
        return os.fsdecode(args).split()
    return [os.fsdecode(a) if isinstance(a, (str, bytes, os.PathLike)) else str(a) for a in args]  # type: ignore


def watch_process_starts() -> None:
    """Route ``subprocess.Popen``, ``multiprocessing``, ``os.system`` and ``os.fork`` (tests/forked.py)
    through ``STARTS.note``."""
    popen_init, process_start, system = subprocess.Popen.__init__, multiprocessing.process.BaseProcess.start, os.system
    fork = os.fork

    @functools.wraps(popen_init)
    def init(self, *args, **kwargs):
        STARTS.note("process", _argv(args[0] if args else kwargs.get("args", [])))
        popen_init(self, *args, **kwargs)

    @functools.wraps(process_start)
    def start(self):
        STARTS.note("multiprocessing", [f"{type(self).__name__}(name={self.name!r})"])
        process_start(self)

    @functools.wraps(system)
    def run_shell(command):
        STARTS.note("os.system", _argv(command))
        return system(command)

    @functools.wraps(fork)
    def fork_a_copy():
        STARTS.note("os.fork", ["fork"])
        return fork()

    subprocess.Popen.__init__ = init  # type: ignore[method-assign]
    multiprocessing.process.BaseProcess.start = start  # type: ignore[method-assign]
    os.system = run_shell
    os.fork = fork_a_copy


# --- the repository: a test writes nothing into it ----------------------------------------------

#: names that appear in the checkout by design while the tests run (caches, the checkout's own venv
#: and git folder): never reported, never looked into
REPO_CACHES = frozenset({".git", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache"})


@dataclass
class RepoTree:
    """The names in each folder of the repository as last seen, to name what a test added. Adding a
    name to a folder moves the folder's mtime, so a check stats every folder (51 here: 0.4 ms) and
    lists only those that moved; the first look lists them all once (11 ms).

    The checks of one process tile its time (each starts where the one before ended), so what a
    module-scoped fixture writes is named at the end of the test that set it up."""

    root: Path
    folders: dict[Path, tuple[int, frozenset[str]]] = field(default_factory=dict)  # folder -> (mtime_ns, names)

    def begin(self) -> None:
        """Take the first look (once a process, before its first test)."""
        if not self.folders:
            self._look_into(self.root)

    def added(self) -> list[str]:
        """Paths (relative to the root; a folder with a trailing ``/``) added since the last call."""
        if not self.folders:
            self.begin()
            return []
        found = []
        for folder, (mtime, names) in list(self.folders.items()):
            try:
                now = os.stat(folder).st_mtime_ns
            except FileNotFoundError:  # removed: so are the folders under it
                del self.folders[folder]
                continue
            if now == mtime:
                continue
            current = self._names(folder)
            self.folders[folder] = (now, current)
            for name in sorted(current - names):
                path = folder / name
                if path.is_dir() and not path.is_symlink():
                    files = self._look_into(path)
                    found.append(f"{path.relative_to(self.root)}/ ({files} file{'s' if files != 1 else ''} in it)")
                else:
                    found.append(str(path.relative_to(self.root)))
        return sorted(found)

    def _look_into(self, top: Path) -> int:
        """Remember ``top`` and the folders under it; the number of files in them."""
        files = 0
        for folder, dirs, names in os.walk(top):
            dirs[:] = [d for d in dirs if d not in REPO_CACHES and not os.path.islink(os.path.join(folder, d))]
            path = Path(folder)
            self.folders[path] = (os.stat(path).st_mtime_ns, self._names(path))
            files += len(names)
        return files

    @staticmethod
    def _names(folder: Path) -> frozenset[str]:
        try:
            return frozenset(name for name in os.listdir(folder) if name not in REPO_CACHES)
        except FileNotFoundError:
            return frozenset()


REPO = RepoTree(Path(__file__).resolve().parents[1])


def written_into_the_repository(workers: int = 1, tree: RepoTree | None = None) -> list[str]:
    """One line naming what the test added to the repository (``REPO``), or none; ``workers``: how
    many pytest-xdist workers run tests at the same time."""
    tree = tree or REPO
    added = tree.added()
    if not added:
        return []
    beside = (f"; under pytest -n a test running at the same time in another of the {workers} workers may "
              "have written it instead (pytest -n0 on the tests named tells which)" if workers > 1 else "")
    return [f"wrote into the repository {tree.root}: {', '.join(added)} (a test writes into its tmp_path: "
            f"delete these and give the run a folder under tmp_path{beside})"]
