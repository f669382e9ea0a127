"""The fw_mpi backend (``framework/strategies/mpi/backend.py``): collectives, DDP and failure.

Each multi-rank test writes a script to ``tmp_path`` and runs it on 2 ranks under
``mpiexec -n 2 python -m mpi4py``; the script asserts and prints a marker that the test checks.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from mpi_helpers import mpiexec, needs_mpi

REPO_ROOT = Path(__file__).resolve().parents[2]


_mpiexec = mpiexec


PRELUDE = """
import torch, torch.distributed as dist
from framework.strategies.mpi.backend import init_mpi_process_group
torch.set_num_threads(1)
rank, world = init_mpi_process_group()
assert world == 2 and dist.get_backend() == "fw_mpi", (world, dist.get_backend())
"""


def _run(tmp_path: Path, body: str, n: int = 2, timeout: float = 90, **env: str) -> subprocess.CompletedProcess:
    script = tmp_path / "script.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path, **env)
    cmd = [_mpiexec(), "-n", str(n), sys.executable, "-m", "mpi4py", str(script)]
    return subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=timeout)


def _assert_ok(proc: subprocess.CompletedProcess, marker: str) -> None:
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert out.count(marker) == 2, out  # both ranks reached the end


COLLECTIVES = """
for dtype in (torch.float32, torch.float64, torch.int64, torch.bfloat16):
    base = torch.tensor([1, 4, 7, 10], dtype=dtype)
    for op, want in ((dist.ReduceOp.SUM, [3, 9, 15, 21]), (dist.ReduceOp.MAX, [2, 5, 8, 11])):
        t = base + rank
        dist.all_reduce(t, op=op)
        assert t.dtype == dtype and t.tolist() == want, (dtype, op, t)
    t = base + rank
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    want = [1, 4, 7, 10] if dtype == torch.int64 else [1.5, 4.5, 7.5, 10.5]  # ints truncate
    assert t.tolist() == want, (dtype, t)

t = torch.arange(12.0).reshape(3, 4).t() * (rank + 1)  # non-contiguous, in place
dist.all_reduce(t)
assert torch.equal(t, torch.arange(12.0).reshape(3, 4).t() * 3)
work = dist.all_reduce(t, async_op=True)  # completed work: wait() and its future both work
assert work.wait() and torch.equal(work.get_future().wait()[0], torch.arange(12.0).reshape(3, 4).t() * 6)
flags = torch.tensor([rank == 0, False])
dist.all_reduce(flags, op=dist.ReduceOp.MAX)
assert flags.tolist() == [True, False]

b = torch.full((3,), float(rank), dtype=torch.bfloat16)
dist.broadcast(b, src=1)
assert b.tolist() == [1.0, 1.0, 1.0]

outs = [torch.empty(2, dtype=torch.int64) for _ in range(world)]
dist.all_gather(outs, torch.full((2,), rank))
assert [o.tolist() for o in outs] == [[0, 0], [1, 1]]
flat = torch.empty(4)
dist.all_gather_into_tensor(flat, torch.full((2,), float(rank)))
assert flat.tolist() == [0, 0, 1, 1]
dist.all_gather_into_tensor(flat, torch.tensor([[rank, 7.0], [5.0, rank]]).t()[0])  # non-contiguous input
assert flat.tolist() == [0, 5, 1, 5]
flat = torch.full((4,), -1.0)
flat[2 * rank: 2 * rank + 2] = rank + 10.0
dist.all_gather_into_tensor(flat, flat[2 * rank: 2 * rank + 2])  # in place, as FSDP gathers
assert flat.tolist() == [10, 10, 11, 11]
dist.all_gather_into_tensor(flat, flat[1:3])  # inside, not its own slot
assert flat.tolist() == [10, 11, 10, 11], flat
assert dist.group.WORLD.group_name == "0"  # c10d's name, by which a DeviceMesh finds the group
part = torch.empty(2)
dist.reduce_scatter_tensor(part, torch.arange(4.0) + rank)
assert part.tolist() == ([1, 3] if rank == 0 else [5, 7])

objs = [None] * world
dist.all_gather_object(objs, {"rank": rank, "name": f"r{rank}"})
assert objs == [{"rank": 0, "name": "r0"}, {"rank": 1, "name": "r1"}]
got = [None] * world if rank == 0 else None
dist.gather_object(("x", rank), got, dst=0)
assert rank != 0 or got == [("x", 0), ("x", 1)]
lst = [rank, {"a": rank}]
dist.broadcast_object_list(lst, src=1)
assert lst == [1, {"a": 1}]

if rank == 0:  # send/recv in both directions
    dist.send(torch.arange(3.0), dst=1)
    back = torch.empty(3)
    dist.recv(back, src=1)
    assert back.tolist() == [0, 2, 4]
else:
    got = torch.empty(3)
    dist.irecv(got, src=0).wait()
    dist.send(got * 2, dst=0)
dist.barrier()
dist.destroy_process_group()
print("COLLECTIVES-OK")
"""

DDP = """
from torch.nn.parallel import DistributedDataParallel as DDP

def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))

def train(model, batches, lr=0.1):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for micro in batches:  # each step: a list of (x, y) micro-batches, mean loss over the step
        opt.zero_grad()
        for i, (x, y) in enumerate(micro):
            last = i == len(micro) - 1
            ctx = model.no_sync() if (isinstance(model, DDP) and not last) else torch.enable_grad()
            with ctx:
                (torch.nn.functional.mse_loss(model(x), y) / len(micro)).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])

B, steps = 4, 10
g = torch.Generator().manual_seed(1)
data = [(torch.randn(2 * B, 8, generator=g), torch.randn(2 * B, 2, generator=g)) for _ in range(2 * steps)]

def check(accumulate):
    k = 2 if accumulate else 1
    full = [[(torch.cat([x for x, _ in data[s * k:(s + 1) * k]]), torch.cat([y for _, y in data[s * k:(s + 1) * k]]))]
            for s in range(steps)]
    ddp_batches = [[(x[rank::2], y[rank::2]) for x, y in data[s * k:(s + 1) * k]] for s in range(steps)]
    reference = train(mlp(), full)
    mine = train(DDP(mlp()), ddp_batches)
    assert (mine - reference).abs().max().item() < 1e-5, (accumulate, (mine - reference).abs().max())
    both = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(both, mine)
    assert torch.equal(both[0], both[1]), "ranks diverged"

check(accumulate=False)
check(accumulate=True)  # no_sync(): first micro-batch accumulates locally, the last one syncs
dist.destroy_process_group()
print("DDP-OK")
"""

OVERLAP = """
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
from torch.nn.parallel import DistributedDataParallel as DDP

overlapped = dist.group.WORLD  # MPICH under mpi4py provides MPI_THREAD_MULTIPLE
assert overlapped.overlap, "the default group should overlap"
synchronous = dist.new_group(backend="fw_mpi")
synchronous.overlap = False

def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64),
                               torch.nn.Tanh(), torch.nn.Linear(64, 2))

def train(model, batches, hook=None):
    if hook is not None:
        model.register_comm_hook(*hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in batches:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])

g = torch.Generator().manual_seed(1)
data = [(torch.randn(8, 8, generator=g), torch.randn(8, 2, generator=g)) for _ in range(8)]
mine = [(x[rank::2], y[rank::2]) for x, y in data]
tiny = 0.01  # MB: two buckets from the second step on, so one is reduced while backward computes the other

# 1. all-reduce on the communication thread gives the very bits of the synchronous one
a = train(DDP(mlp(), process_group=overlapped, bucket_cap_mb=tiny), mine)
b = train(DDP(mlp(), process_group=synchronous, bucket_cap_mb=tiny), mine)
assert torch.equal(a, b), (a - b).abs().max()
assert (a - train(mlp(), data)).abs().max() < 1e-5  # and matches one process on the full batch
assert overlapped._thread is not None and synchronous._thread is None  # DDP's buckets did take the thread

# 2. a comm hook that chains collectives in its futures' callbacks (PowerSGD), on both paths
def powersgd_hook(group):
    state = powersgd.PowerSGDState(process_group=group, matrix_approximation_rank=1, start_powerSGD_iter=2)
    return state, powersgd.powerSGD_hook
a = train(DDP(mlp(), process_group=overlapped, bucket_cap_mb=tiny), mine, powersgd_hook(overlapped))
b = train(DDP(mlp(), process_group=synchronous, bucket_cap_mb=tiny), mine, powersgd_hook(synchronous))
assert torch.equal(a, b), (a - b).abs().max()

# 3. queued all-reduces complete (staged dtypes, AVG, non-contiguous: copied back first) and keep
#    their order among synchronous calls
works, want = [], []
for i in range(20):
    t = torch.full((1 << 16,), float(i + rank))  # large enough to be still queued at the next calls
    works.append((t, dist.all_reduce(t, async_op=True)))
    want.append(2 * i + 1)
    t = torch.full((3, 5), float(i + rank), dtype=(torch.bfloat16, torch.float32)[i % 2]).t()
    works.append((t, dist.all_reduce(t, op=dist.ReduceOp.AVG, async_op=True)))
    want.append(i + 0.5)
    if i % 3 == 0:  # synchronous calls run after the queued ones (the same tag: order matters)
        s = torch.full((15,), 100.0 * (i + rank))
        dist.all_reduce(s)
        assert torch.all(s == 100.0 * (2 * i + 1)), (i, s)
        s = torch.tensor([float(rank)])
        dist.broadcast(s, src=1)
        assert s.item() == 1.0
for (t, work), w in zip(works, want):
    assert work.wait() and work.is_completed()
    assert t.dtype in (torch.bfloat16, torch.float32) and torch.all(t == w), (t, w)
dist.destroy_process_group()
print("OVERLAP-OK")
"""

FAILING_THREAD = """
from torch.nn.parallel import DistributedDataParallel as DDP

group = dist.group.WORLD
assert group.overlap

class Failing:  # an MPI that fails every all-reduce, on the communication thread
    def __init__(self, comm):
        self.comm = comm
    def Allreduce(self, *args, **kwargs):
        raise RuntimeError("injected all-reduce failure")
    def __getattr__(self, name):
        return getattr(self.comm, name)

model = DDP(torch.nn.Linear(4, 2))
group.comm = Failing(group.comm)
try:
    model(torch.randn(3, 4)).sum().backward()
except RuntimeError as err:
    assert "injected all-reduce failure" in str(err), err
else:
    raise AssertionError("DDP's backward did not raise the communication thread's error")
work = dist.all_reduce(torch.ones(2), async_op=True)
for wait in (work.wait, work.get_future().wait):
    try:
        wait()
    except RuntimeError as err:
        assert "injected all-reduce failure" in str(err), err
    else:
        raise AssertionError(f"{wait} did not raise the communication thread's error")
group.comm = group.comm.comm  # the group keeps working afterwards
t = torch.ones(2)
dist.all_reduce(t)
assert t.tolist() == [2.0, 2.0]
dist.destroy_process_group()
print("FAILING-THREAD-OK")
"""

EXIT_RIGHT_AFTER = """
t = torch.ones(1 << 12)
for _ in range(20):
    dist.all_reduce(t, async_op=True).wait()
print("EXIT-OK")  # and exit at once, while the communication thread may still be completing futures
"""

SERIALIZED = """
from mpi4py import MPI
from torch.nn.parallel import DistributedDataParallel as DDP
from framework.strategies.mpi.process_group import MPIProcessGroup

assert MPI.Query_thread() == MPI.THREAD_SERIALIZED
assert not dist.group.WORLD.overlap  # below MPI_THREAD_MULTIPLE: synchronous, as before
model = DDP(torch.nn.Linear(4, 2), bucket_cap_mb=0.0001)
model(torch.randn(3, 4)).sum().backward()
assert dist.group.WORLD._thread is None
try:
    MPIProcessGroup(MPI.COMM_WORLD, overlap=True)
except ValueError as err:
    assert "MPI_THREAD_MULTIPLE" in str(err), err
else:
    raise AssertionError("overlap=True accepted without MPI_THREAD_MULTIPLE")
dist.destroy_process_group()
print("SERIALIZED-OK")
"""

CRASH = """
import time
t = torch.ones(1)
dist.all_reduce(t)
if rank == 1:
    raise RuntimeError("boom on rank 1")
time.sleep(0.5)
dist.all_reduce(t)  # rank 0 would wait here forever without -m mpi4py
print("UNREACHABLE")
"""


def under_mpiexec(test):
    """A test that runs a script under ``mpiexec -n 2`` (skipped without MPI), bounded in time."""
    return needs_mpi(pytest.mark.mpi(pytest.mark.timeout(60)(test)))


@pytest.fixture(scope="module")
def one_job(tmp_path_factory) -> subprocess.CompletedProcess:
    """The four cases below in one ``mpiexec -n 2`` job, one after the other, each in a process
    group of its own (each ends by destroying it; the next one's prelude makes a new one)."""
    cases = (COLLECTIVES, DDP, OVERLAP, FAILING_THREAD)
    return _run(tmp_path_factory.mktemp("mpi_backend"), PRELUDE.join(textwrap.dedent(case) for case in cases))


@under_mpiexec
def test_collectives_over_fw_mpi(one_job):
    _assert_ok(one_job, "COLLECTIVES-OK")


@under_mpiexec
def test_ddp_over_fw_mpi_matches_one_process_and_no_sync(one_job):
    _assert_ok(one_job, "DDP-OK")


@under_mpiexec
def test_overlapped_all_reduce_matches_the_synchronous_one_bit_for_bit(one_job):
    _assert_ok(one_job, "OVERLAP-OK")


@under_mpiexec
def test_an_error_on_the_communication_thread_surfaces_in_backward_and_wait(one_job):
    _assert_ok(one_job, "FAILING-THREAD-OK")


@under_mpiexec
def test_a_process_exits_cleanly_right_after_overlapped_all_reduces(tmp_path):
    # without stopping the communication thread at exit, 38 runs of 40 aborted in finalisation
    # ("terminate called without an active exception")
    _assert_ok(_run(tmp_path, EXIT_RIGHT_AFTER), "EXIT-OK")


@under_mpiexec
def test_without_thread_multiple_all_reduce_stays_synchronous(tmp_path):
    _assert_ok(_run(tmp_path, SERIALIZED, MPI4PY_RC_THREAD_LEVEL="serialized"), "SERIALIZED-OK")


@under_mpiexec
def test_exception_on_one_rank_ends_the_job(tmp_path):
    start = time.monotonic()
    proc = _run(tmp_path, CRASH, timeout=60)
    elapsed = time.monotonic() - start
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "boom on rank 1" in out and "UNREACHABLE" not in out, out
    assert elapsed < 30, f"the job took {elapsed:.1f}s to end"


def test_register_is_idempotent():
    from framework.strategies.mpi.backend import register_mpi_backend

    assert register_mpi_backend() == "fw_mpi"
    assert register_mpi_backend() == "fw_mpi"
    assert register_mpi_backend("fw_mpi_test") == "fw_mpi_test"


def test_missing_mpi4py_says_how_to_install(monkeypatch):
    import torch.distributed as dist

    from framework.errors import DistributedSetupError
    from framework.strategies.mpi.backend import init_mpi_process_group

    monkeypatch.setitem(sys.modules, "mpi4py", None)  # makes ``import mpi4py`` fail
    monkeypatch.setattr(dist, "is_mpi_available", lambda: False)
    from conftest import ROOT

    with pytest.raises(DistributedSetupError, match=re.escape(f"pip install -e '{ROOT}[mpi]'")):  # fw runs from a clone
        init_mpi_process_group()
    assert not dist.is_initialized()
