"""Which ranks a stuck MPI collective waits for (the watchdog's roll call, ``threads.py``).

MPI says nothing about who has not arrived in a collective. So a rank that has waited in one for
a second tells every other rank of the group so, on a communicator of its own (a ``Dup``: these
messages never match the group's), and tells them again when the wait ends. When a rank's wait
passes the timeout, the ranks it has not heard waiting are the ones that did not arrive: stopped
(SIGSTOP, a dead node), or busy outside MPI (a ``training_step`` that never returns, a data loader
that blocks). A healthy step sends nothing: only waits longer than a second do, two small
messages to each peer, and the watchdog reads what came once a second (``MPI_Iprobe``).

A rank that has waited longer than a second also asks the ranks not heard waiting where they are
(``ask``); each one's watchdog answers with its main thread's place (``framework/stacks.py``: its
marks and the user's line, ``in training_step, at job.py:42 time.sleep(600) in training_step``),
which the waiting rank's report names, and says it in its own log once the asker has waited a
report's time (``Watchdog``).

It needs ``MPI_THREAD_MULTIPLE`` (the watchdog calls MPI while the group's thread is inside a
collective); below it the watchdog names no ranks.
"""

from __future__ import annotations

import atexit
import threading
from typing import Any

#: bytes per message, zero-padded: b"w" + what (waits in it), b"d" (the wait is done), b"q" + the
#: seconds waited (where are you?), b"a" + where (the answer)
_SIZE = 512
_TAG = 7


class RollCall:
    """A group's record of which of its other ranks are waiting in a collective now."""

    def __init__(self, comm: Any) -> None:
        from mpi4py import MPI

        self._mpi = MPI
        self.comm = comm.Dup()  # collective: every rank of the group builds its group's watchdog
        me = comm.Get_rank()
        self.peers = [r for r in range(comm.Get_size()) if r != me]
        self.world_ranks = comm.Get_group().Translate_ranks(list(range(comm.Get_size())), MPI.COMM_WORLD.Get_group())
        self.waiting: dict[int, str] = {}  # peer (group rank) -> what it waits in, as it last said
        self.questions: dict[int, float] = {}  # peer -> how long it had waited when it asked where this rank is
        self.answers: dict[int, str] = {}  # peer -> where it said it was, when asked
        self._sends: list[Any] = []  # (request, buffer): kept until the send completes
        self._lock = threading.Lock()
        self._closed = False
        atexit.register(self.close)  # before mpi4py's MPI_Finalize (registered at its import)

    def announce(self, what: str | None) -> None:
        """Tell every peer that this rank waits in ``what`` (None: that its wait is over)."""
        self._send(self.peers, b"d" if what is None else b"w" + what.encode())

    def ask(self, peers: list[int], waited: float) -> None:
        """Ask ``peers`` (group ranks) where they are; this rank has waited ``waited`` seconds."""
        self._send(peers, b"q" + f"{waited:.1f}".encode())

    def answer(self, peer: int, where: str) -> None:
        self._send([peer], b"a" + where.encode())

    def _send(self, peers: list[int], message: bytes) -> None:
        buf = bytearray(message[:_SIZE].ljust(_SIZE, b"\0"))
        with self._lock:
            if self._closed:
                return
            self._sends = [(req, b) for req, b in self._sends if not req.Test()]
            for peer in peers:
                self._sends.append((self.comm.Isend([buf, self._mpi.BYTE], dest=peer, tag=_TAG), buf))
            self._mpi.Request.Testall([req for req, _ in self._sends])  # on its way before this rank goes on

    def read(self) -> None:
        """Take in what the peers said since the last read."""
        status = self._mpi.Status()
        buf = bytearray(_SIZE)
        with self._lock:
            while not self._closed and self.comm.Iprobe(source=self._mpi.ANY_SOURCE, tag=_TAG, status=status):
                source = status.Get_source()
                self.comm.Recv([buf, self._mpi.BYTE], source=source, tag=_TAG)
                kind, text = buf[:1], bytes(buf[1:]).rstrip(b"\0").decode(errors="replace")
                if kind == b"w":
                    self.waiting[source] = text
                elif kind == b"d":
                    self.waiting.pop(source, None)
                elif kind == b"q":
                    self.questions[source] = float(text)
                else:
                    self.answers[source] = text

    def absent(self) -> list[int]:
        """The world ranks of the peers not heard waiting, after reading what came."""
        return [self.world_ranks[p] for p in self.absent_peers()]

    def absent_peers(self) -> list[int]:
        """The group ranks of the peers not heard waiting, after reading what came."""
        self.read()
        return [p for p in self.peers if p not in self.waiting]

    def where_absent(self) -> dict[int, str]:
        """World rank -> where it said it was, of the peers not heard waiting that answered."""
        return {self.world_ranks[p]: self.answers[p] for p in self.absent_peers() if p in self.answers}

    def close(self) -> None:
        with self._lock:
            self._closed = True


def describe_absent(ranks: list[int], where: dict[int, str] | None = None) -> str:
    """'rank 1 had not arrived' / 'ranks 1, 3 had not arrived', with what that means, and where
    those that answered said they were (``where``: world rank -> place)."""
    if not ranks:
        return "every rank was waiting (collectives called in different orders?)"
    who = f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))
    said = "; ".join(f"rank {r} is {where[r]}" for r in ranks if where and where.get(r))
    return f"{who} had not arrived (stopped, or stuck outside MPI: in a training_step or a data loader)" + \
        (f": {said}" if said else "")
