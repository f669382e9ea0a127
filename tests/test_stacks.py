"""framework/stacks.py: the user's line of a thread's stack, and a loader worker's stack dumped on
its signal (in this process: the multi-process cases are tests/distributed/test_stuck_rank.py)."""

from __future__ import annotations

import faulthandler
import functools
import inspect
import os
import pickle
import signal
import sysconfig
import threading
import time

import pytest

from framework import stacks
from framework.trainer.heartbeat import Heartbeat

HERE = os.path.abspath(__file__)  # as the line names it: the tests run in their tmp_path (conftest.py), not above it


def _called_by(path: str, name: str, fn):
    """Call ``fn`` from a function ``name`` whose code says it is in the file ``path`` (fw's loop, torch)."""
    namespace: dict = {}
    exec(compile(f"def {name}(fn):\n    return fn()\n", path, "exec"), namespace)
    return namespace[name](fn)


FIT_LOOP = os.path.join(stacks._FW, "loops", "fit.py")


def _main_thread_from_another():
    found = []

    def read():  # once the main thread waits in join (it may be in start still)
        for _ in range(500):
            found.append(stacks.main_thread())
            if found[-1].line is None or "reader.join()" in found[-1].line:
                return
            time.sleep(0.01)

    reader = threading.Thread(target=read)
    reader.start()
    reader.join()  # the main thread's line
    return found[-1]


def _line_of(fn, code: str) -> int:
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, text in enumerate(lines) if text.strip() == code)


def test_the_line_is_the_innermost_frame_of_the_users_code_that_fw_called():
    def training_step():
        return _main_thread_from_another()

    found = _called_by(FIT_LOOP, "run_fit", training_step)
    # the innermost frame is threading's join, then _main_thread_from_another (the user's: this file)
    line = _line_of(_main_thread_from_another, "reader.join()  # the main thread's line")
    assert found == stacks.Stuck(f"{HERE}:{line} reader.join()  # the main thread's line in _main_thread_from_another")
    # no frame of fw's outside: the script's own call (trainer.fit) is no place to be stuck in
    assert _main_thread_from_another() == stacks.Stuck(None)


def test_a_call_into_torch_distributed_is_named_and_counts_as_waiting():
    c10d = os.path.join(sysconfig.get_paths()["purelib"], "torch", "distributed", "distributed_c10d.py")
    found, done = [], threading.Event()

    def read():  # once the main thread waits in the all_reduce below
        for _ in range(500):
            found.append(stacks.main_thread())
            if found[-1].waiting:
                break
            time.sleep(0.01)
        done.set()

    def training_step():
        reader.start()
        _called_by(c10d, "all_reduce", functools.partial(done.wait, 10))  # waits in threading: not the user's

    reader = threading.Thread(target=read)
    _called_by(FIT_LOOP, "run_fit", training_step)
    reader.join()
    line = _line_of(_called_by, "return namespace[name](fn)")  # the user's frame that called torch.distributed
    assert found[-1] == stacks.Stuck(f"{HERE}:{line} return namespace[name](fn) in _called_by, in torch.distributed's "
                                     "all_reduce", waiting=True)


def test_a_long_line_of_code_is_cut_and_a_file_in_the_working_folder_is_named_from_there(tmp_path):
    script = tmp_path / "long.py"  # tmp_path is the working folder
    code = "y = [" + ", ".join(map(str, range(100))) + "]"
    script.write_text(f"x = 1\n    {code}\n")
    assert stacks.describe(str(script), 2, "f") == f"long.py:2 {code[:77]}... in f"
    assert stacks.describe(str(script), 1, "<module>") == "long.py:1 x = 1 in <module>"


@pytest.fixture
def registered():
    """This process set up as a loader worker is (``DumpsStack``), and put back afterwards."""
    calls = []
    init = stacks.DumpsStack(calls.append)
    init(7)
    try:
        yield calls
    finally:
        faulthandler.unregister(stacks.WORKER_SIGNAL)
        stacks._KEPT.pop().close()


def test_a_worker_dumps_its_stack_on_the_signal_and_the_users_line_is_found_in_it(registered):
    assert registered == [7]  # the loader's own init function ran after fw's
    assert stacks._catches(os.getpid(), stacks.WORKER_SIGNAL)
    dump = stacks.worker_stack(os.getpid())  # this process, as the heartbeat asks a worker
    assert dump.startswith("Current thread 0x") or dump.startswith("Thread 0x"), dump
    name = "test_a_worker_dumps_its_stack_on_the_signal_and_the_users_line_is_found_in_it"
    line = _line_of(globals()[name], "dump = stacks.worker_stack(os.getpid())  # this process, as the heartbeat asks a worker")
    assert stacks._user_line_in(dump) == stacks.describe(__file__, line, name)
    assert f"{HERE}:{line} dump = stacks.worker_stack(" in stacks._user_line_in(dump)


def test_a_process_that_has_not_registered_is_never_signalled():
    assert not stacks._catches(os.getpid(), stacks.WORKER_SIGNAL)
    assert stacks._catches(os.getpid(), signal.SIGINT)  # Python's own handler
    assert stacks.worker_stack(os.getpid()) == ""  # no signal sent: its default action would end the process


def test_the_worker_set_up_chains_the_loaders_own_and_travels_to_spawned_workers():
    from torch.utils.data import DataLoader

    loader = DataLoader(list(range(4)), num_workers=1, worker_init_fn=print)
    assert stacks.dumping_stacks(loader) is loader and isinstance(loader.worker_init_fn, stacks.DumpsStack)
    assert loader.worker_init_fn.then is print
    first = loader.worker_init_fn
    assert stacks.dumping_stacks(loader).worker_init_fn is first  # once only (a loader asked for again)
    assert pickle.loads(pickle.dumps(first)).then is print  # spawn and forkserver pickle it
    without = DataLoader(list(range(4)))
    assert stacks.dumping_stacks(without).worker_init_fn is None  # no workers: nothing to ask


def test_the_report_names_the_line_of_each_rank():
    class Run:
        class strategy:
            timeout = 9.0

    beat = Heartbeat(Run())  # type: ignore[arg-type]
    now = 100.0
    seen = {1: ("4|in epoch 0, batch 3, in training_step|job.py:8 x = a | b in training_step", now),
            2: ("9|in epoch 0, batch 3, in the backward pass's gradient sync|", now),
            3: ("2|in epoch 0, batch 3, in training_step|job.py:9 time.sleep(600) in training_step", now - 10)}
    assert beat._describe(seen, now, "in epoch 0, batch 3, in the backward pass's gradient sync") == (
        "rank 3 stopped answering (no heartbeat for 10 s, last in epoch 0, batch 3, in training_step, at job.py:9 "
        "time.sleep(600) in training_step); rank 1 is in epoch 0, batch 3, in training_step, at job.py:8 x = a | b "
        "in training_step")
