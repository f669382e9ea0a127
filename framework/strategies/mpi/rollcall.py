"""Which ranks a stuck MPI collective waits for (the watchdog's roll call, ``threads.py``).

MPI says nothing about who has not arrived in a collective. So a rank that has waited in one for
a second tells every other rank of the group so, on a communicator of its own (a ``Dup``: these
messages never match the group's), and tells them again when the wait ends. When a rank's wait
passes the timeout, the ranks it has not heard waiting are the ones that did not arrive: stopped
(SIGSTOP, a dead node), or busy outside MPI (a ``training_step`` that never returns, a data loader
that blocks). A healthy step sends nothing: only waits longer than a second do, two small
messages to each peer, and the watchdog reads what came once a second (``MPI_Iprobe``).

It needs ``MPI_THREAD_MULTIPLE`` (the watchdog calls MPI while the group's thread is inside a
collective); below it the watchdog names no ranks.
"""

from __future__ import annotations

import atexit
import threading
from typing import Any

_SIZE = 64  # bytes per message: b"w" + what, or b"d" (the wait is done), zero-padded
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
        self._sends: list[Any] = []  # (request, buffer): kept until the send completes
        self._lock = threading.Lock()
        self._closed = False
        atexit.register(self.close)  # before mpi4py's MPI_Finalize (registered at its import)

    def announce(self, what: str | None) -> None:
        """Tell every peer that this rank waits in ``what`` (None: that its wait is over)."""
        message = (b"w" + what.encode()[: _SIZE - 1] if what is not None else b"d").ljust(_SIZE, b"\0")
        buf = bytearray(message)
        with self._lock:
            if self._closed:
                return
            self._sends = [(req, b) for req, b in self._sends if not req.Test()]
            for peer in self.peers:
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
                if buf[:1] == b"w":
                    self.waiting[source] = bytes(buf[1:]).rstrip(b"\0").decode(errors="replace")
                else:
                    self.waiting.pop(source, None)

    def absent(self) -> list[int]:
        """The world ranks of the peers not heard waiting, after reading what came."""
        self.read()
        return [self.world_ranks[p] for p in self.peers if p not in self.waiting]

    def close(self) -> None:
        with self._lock:
            self._closed = True


def describe_absent(ranks: list[int]) -> str:
    """'rank 1 had not arrived' / 'ranks 1, 3 had not arrived', with what that means."""
    if not ranks:
        return "every rank was waiting (collectives called in different orders?)"
    who = f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))
    return f"{who} had not arrived (stopped, or stuck outside MPI: in a training_step or a data loader)"
