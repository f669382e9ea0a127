"""Which global batches were not trained whole: a replica missing from a step's quorum leaves
its share of that step's global batch untrained, and a step whose commit failed (a replica lost in
the middle of its all-reduce) is not applied at all.

The record (``Untrained``) travels with the run: in every checkpoint (``fault_tolerance`` entry)
and in the state a rejoining replica takes from a live peer, so that every replica and every
checkpoint says the same thing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Untrained:
    """Runs of untrained global batches: each ``{"epoch", "first", "last", "missing", "reason"}``,
    ``first``..``last`` the batch indices of the epoch (inclusive), ``missing`` the replica ids
    whose shares were not trained (every id: the whole global batch)."""

    entries: list[dict[str, Any]] = field(default_factory=list)

    def record(self, batches: list[tuple[int, int]], missing: list[str], reason: str) -> None:
        """Note ``batches`` ((epoch, batch index) pairs) as trained without ``missing``'s shares."""
        for epoch, batch in batches:
            last = self.entries[-1] if self.entries else None
            if (last is not None and last["epoch"] == epoch and last["last"] + 1 == batch
                    and last["missing"] == missing and last["reason"] == reason):
                last["last"] = batch
            else:
                self.entries.append({"epoch": epoch, "first": batch, "last": batch, "missing": list(missing),
                                     "reason": reason})

    @property
    def batches(self) -> int:
        """How many global batches were not trained whole."""
        return sum(e["last"] - e["first"] + 1 for e in self.entries)

    def since(self, index: int) -> Untrained:
        """The runs recorded after the first ``index`` ones."""
        return Untrained([dict(e) for e in self.entries[index:]])

    def describe(self) -> str:
        """``"3 global batches (epoch 0 batches 4-6 without replica 1: replica lost)"``."""
        if not self.entries:
            return "no global batch"
        runs = []
        for e in self.entries:
            span = f"{e['first']}" if e["first"] == e["last"] else f"{e['first']}-{e['last']}"
            who = ", ".join(e["missing"])
            runs.append(f"epoch {e['epoch']} batch{'es' if e['first'] != e['last'] else ''} {span} "
                        f"without replica{'s' if len(e['missing']) > 1 else ''} {who}: {e['reason']}")
        n = self.batches
        return f"{n} global batch{'es' if n != 1 else ''} ({'; '.join(runs)})"

    def state_dict(self) -> list[dict[str, Any]]:
        return [dict(e, missing=list(e["missing"])) for e in self.entries]

    def load_state_dict(self, state: list[dict[str, Any]]) -> None:
        self.entries = [dict(e, missing=list(e["missing"])) for e in state]
