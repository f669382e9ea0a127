"""While a distributed run waits, say for whom: every rank's heartbeat, in the rendezvous store.

A rank that stops answering (SIGSTOP, a frozen node, a deadlock) leaves the others waiting in a
collective until ``trainer.strategy.timeout``. So that they can say for whom while they wait,
each rank runs a ``Heartbeat`` thread during a run: every few seconds it writes a beat count and
where the rank is (stage, epoch, batch, and the collective it waits in: the backward pass's
gradient sync, a metric sync, a barrier, a checkpoint save) and the main thread's line of the
user's code (``framework/stacks.py``: ``job.py:42 time.sleep(600) in training_step``; a data
loader worker's line, asked of the worker, where the main thread waits for a batch) to the store
that the ranks met at, over a connection of its own with a short timeout. When its own rank has
made no progress for ``report_every`` seconds, the thread reads everyone's beats and prints one
line: its own line of code, which ranks stopped answering (their beat count stood still, with the
last line they sent), which are elsewhere (and at which line), or that all are alive in the same
step (a slow step). The main thread's only cost is the progress counters it keeps anyway; reading
its stack costs the heartbeat thread some 15 microseconds of CPU a beat.

Only for process groups that met at a TCP store (fw's launcher, torchrun, srun, ``tcp://``);
the ``mpi`` strategy's group watches its own calls (``strategies/mpi/process_group.py``).
"""

from __future__ import annotations

import datetime
import itertools
import sys
import threading
import time
from typing import TYPE_CHECKING

import torch.distributed as dist

from framework import stacks, waiting
from framework.strategies.launchers.rendezvous import default_tcp_store

if TYPE_CHECKING:
    from framework.trainer.run import Run

_RUNS = itertools.count(1)  # runs of this process


class Heartbeat:
    """Context manager: beats and watches for the duration of one run (see module doc)."""

    def __init__(self, run: Run) -> None:
        self.run = run
        timeout = float(getattr(run.strategy, "timeout", 300.0))
        self.report_every = min(30.0, timeout / 3)
        self.beat_every = min(5.0, self.report_every / 2)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Heartbeat:
        strategy = self.run.strategy
        store = _tcp_store()
        if not strategy.is_distributed or store is None:
            return self
        # a namespace of this run's own (the store may hold an earlier run's beats); every rank
        # runs the same runs in the same order, so they agree on the number without a collective
        run = str(next(_RUNS))
        self._thread = threading.Thread(target=self._run, args=(store, run), name="fw-heartbeat", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:  # a thread held up in a store call ends after it on its own (a daemon)
            self._thread.join(timeout=_JOIN_S)

    # -- the thread ---------------------------------------------------------------------------
    def _run(self, address: tuple[str, int], run: str) -> None:
        rank, size = self.run.strategy.global_rank, self.run.strategy.world_size
        store = _connection(address, connect_s=min(1.0, self.beat_every), timeout_s=self.beat_every)
        if store is None:
            return  # the store is gone already, or does not answer: the run is over or failing on its own
        keys = [f"fw/heartbeat/{run}/{r}" for r in range(size)]
        beats, last_progress, still_since, next_report = 0, None, time.monotonic(), self.report_every
        store_gone = False
        seen: dict[int, tuple[str, float]] = {}  # rank -> (its last beat, when that changed)
        while beats == 0 or not self._stop.wait(self.beat_every):  # the first beat at once
            beats += 1
            progress = self._progress()
            # the main thread's line; a loader worker's, asked of it, once the rank stands still
            where, here = self._where(), stacks.main_thread(workers=progress == last_progress)
            try:  # once the store is gone (its host stopped), not tried again: c10d warns at each try
                if not store_gone:
                    store.set(keys[rank], f"{beats}|{where}|{here.line or ''}")
            except (RuntimeError, dist.DistError):
                store_gone = True  # the store's host may be the rank that stopped: said below
                _CONNECTIONS.pop(address, None)  # the next run connects anew
            now = time.monotonic()
            if progress != last_progress:
                last_progress, still_since, next_report = progress, now, self.report_every
                seen.clear()
                continue
            # stalled: from now on watch the others' beats, to name the ones that stand still
            answer = _STORE_GONE if store_gone else _read_beats(store, keys, rank, seen, now)
            store_gone = answer is not None
            if now - still_since < next_report:
                continue
            next_report += self.report_every
            if answer is None:
                answer = self._describe(seen, now, where)
            timeout = getattr(self.run.strategy, "timeout", 300.0)
            mine = f", at {here.line}" if here.line else ""
            # in the user's code, unless in a torch.distributed call made there (a collective of the user's)
            users = waiting.in_user_code() and not here.waiting
            for_whom = "the other ranks may be waiting for it" if users else "waiting for the other ranks"
            sys.stderr.write(f"fw: rank {rank} of {size} has been {where} for {now - still_since:.0f} s{mine}, "
                             f"{for_whom}: {answer} (the job ends after trainer.strategy.timeout={timeout:g} s)\n")
            sys.stderr.flush()

    def _progress(self) -> tuple:
        state = self.run.state
        return state.stage, state.epoch, state.global_step, state.position.batches, state.eval_batches

    def _where(self) -> str:
        """Where the rank is, and what it waits in there (``framework/waiting.py``)."""
        state, marks = self.run.state, waiting.now()
        stage = state.stage
        if stage == "train" and self.run.fit_batches is None:  # a fit's set-up: its stage is "train" from the start
            stage = None
        if stage == "train":
            where = f"in epoch {state.epoch}, batch {state.position.batches}"
        else:
            where = f"in {stage or 'set-up'} (epoch {state.epoch}, step {state.global_step})"
        return f"{where}, in {marks}" if marks else where

    def _describe(self, seen: dict[int, tuple[str, float]], now: float, mine: str) -> str:
        silent, elsewhere, lines = [], [], []
        for other, (value, changed) in sorted(seen.items()):
            parts = value.split("|", 2)  # beats|where|line (a line of code may hold '|')
            where = parts[1] if len(parts) > 1 else "before its first beat"
            line = parts[2] if len(parts) > 2 else ""
            at = f", at {line}" if line else ""
            if now - changed >= 1.5 * self.beat_every:
                silent.append(f"rank {other} stopped answering (no heartbeat for {now - changed:.0f} s, last {where}{at})")
            elif where != mine:
                elsewhere.append(f"rank {other} is {where}{at}")
            elif line:
                lines.append(f"rank {other} at {line}")
        if silent or elsewhere:
            return "; ".join(silent + elsewhere + lines)
        same = "every rank is alive and at the same place (a slow step?)"
        return f"{same}: {'; '.join(lines)}" if lines else same


_STORE_GONE = "the store the ranks met at does not answer (its host, usually rank 0, stopped?)"
_JOIN_S = 1.0  # how long a run's end waits for its heartbeat thread
#: one connection a process to each store the heartbeats write to, kept from run to run: a new
#: connection to torchrun's agent store stalls until its timeout now and then (3 of 80 here,
#: torch's client and agent alone), and a run whose thread stalled so had no heartbeat, and c10d
#: printed a C++ stack trace for it
_CONNECTIONS: dict[tuple[str, int], dist.TCPStore] = {}
_CONNECTING = threading.Lock()


def _connection(address: tuple[str, int], connect_s: float, timeout_s: float) -> dist.TCPStore | None:
    """This process's heartbeat connection to the store at ``address`` (made on first use), or
    None when it cannot be made now."""
    with _CONNECTING:
        store = _CONNECTIONS.get(address)
        if store is None:
            try:
                store = dist.TCPStore(*address, is_master=False, timeout=datetime.timedelta(seconds=connect_s))
            except (RuntimeError, dist.DistError):
                return None
            _CONNECTIONS[address] = store
        store.set_timeout(datetime.timedelta(seconds=timeout_s))
        return store


def _read_beats(store: dist.Store, keys: list[str], rank: int, seen: dict, now: float) -> str | None:
    """Update ``seen`` from the store; a message instead when the store does not answer."""
    others = [r for r in range(len(keys)) if r != rank]
    try:
        present = [r for r in others if store.check([keys[r]])]
        values = store.multi_get([keys[r] for r in present]) if present else []
    except (RuntimeError, dist.DistError):
        return _STORE_GONE
    found = dict(zip(present, (v.decode() for v in values), strict=True))
    for other in others:
        value = found.get(other, "")
        if other not in seen or seen[other][0] != value:
            seen[other] = (value, now)
    return None


def _tcp_store() -> tuple[str, int] | None:
    """(host, port) of the TCP store the default process group met at, else None."""
    store = default_tcp_store()
    return None if store is None else (store.host, store.port)
