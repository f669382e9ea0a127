"""The stateful parts a checkpoint is made of, and the adapters that make fw's pieces such parts.

A checkpoint is a set of named parts, each with ``state_dict()``/``load_state_dict()``, as in
Fabric (``strategy.save_checkpoint(path, state)``) and torchtitan (``states={...}``): the
strategy saves and loads them (``Strategy.save_checkpoint(path, parts)``,
``Strategy.load_checkpoint(path, parts)``) and so decides the format and which ranks write.
``CheckpointParts`` names them:

- ``shared``: one state for the whole job (rank 0's is written; every rank loads it): the
  module, each optimizer and scheduler, the progress, the callbacks, the grad scaler. In load
  order; an ``OnLoad`` among them is a step between parts (a hook that sees the whole
  checkpoint) and writes nothing.
- ``per_rank``: each rank's own (written as a list over the ranks; each rank loads its entry):
  RNG states, running metric aggregates, a stateful loader's position.
- ``values``: plain entries (the format version, the world size, the job ids).

The keys are the checkpoint file's (Lightning's where Lightning has one: ``state_dict``,
``optimizer_states``, ``lr_schedulers``, ``callbacks``), so a file stays what it was. A user's
own stateful object is one more part: ``trainer.checkpoint_parts[name] = obj`` (or Lightning's
``on_save_checkpoint``/``on_load_checkpoint``, which keep working).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from framework.errors import CheckpointError


class Stateful(Protocol):
    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> None: ...


@dataclass(frozen=True)
class OnLoad:
    """A step on load between parts: ``fn(checkpoint)`` with the whole file (a hook)."""

    fn: Callable[[dict], None]

    def __call__(self, checkpoint: dict) -> None:
        self.fn(checkpoint)


@dataclass
class CheckpointParts:
    """What one checkpoint holds (see the module docstring). ``on_write`` sees the whole
    checkpoint before it is written (the ``on_save_checkpoint`` hooks: they may add to it)."""

    shared: dict[str, Stateful | OnLoad] = field(default_factory=dict)
    per_rank: dict[str, Stateful] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)
    on_write: Callable[[dict], None] | None = None
    kept_per_rank: list[dict[str, Any]] | None = None  # every rank's, kept at the end of a fit (``EndOfFit``)
    kept_own: dict[str, Any] | None = None  # this rank's, kept at the end of a fit whose group stays up

    def shared_states(self) -> dict[str, Any]:
        return {key: part.state_dict() for key, part in self.shared.items() if not isinstance(part, OnLoad)}

    def rank_states(self) -> dict[str, Any]:
        return {key: part.state_dict() for key, part in self.per_rank.items()}

    def assemble(self, per_rank: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """The checkpoint: the values, the shared states, each per-rank part as a list over ranks."""
        checkpoint = {**self.values, **self.shared_states()}
        checkpoint.update({key: [mine[key] for mine in per_rank] for key in self.per_rank})
        if self.on_write is not None:
            self.on_write(checkpoint)
        return checkpoint

    def load(self, checkpoint: dict[str, Any], rank: int, world_size: int,
             data: tuple[int, int] | None = None) -> None:
        """Every part from ``checkpoint``, in order; a per-rank part from ``rank``'s entry, or,
        in a file written by another number of ranks, a ``FromRanks`` of the entries this rank
        takes over. A part of the data position (``DATA_PARTS``) goes by data-parallel rank
        (``data``: this rank's and their number; ranks that split a model read the same data
        and keep one copy of its state between them). A part the file lacks stays as it is."""
        for key, part in self.shared.items():
            if isinstance(part, OnLoad):
                part(checkpoint)
            elif key in checkpoint:
                part.load_state_dict(checkpoint[key])
        for key, part in self.per_rank.items():
            states, me, ranks = checkpoint.get(key) or [], rank, world_size
            if key in DATA_PARTS and states:
                states, (me, ranks) = _one_per_replica(states, checkpoint), data or (rank, world_size)
            if len(states) == ranks:
                part.load_state_dict(states[me])
            elif states:
                part.load_state_dict(FromRanks.regroup(states, me, ranks))


#: per-rank parts that belong to the data a rank reads (the same on the ranks of a tensor-parallel group)
DATA_PARTS = frozenset({"metrics", "loader_states"})


def _one_per_replica(states: Sequence[Any], checkpoint: dict[str, Any]) -> list[Any]:
    """The entries of one rank per data-parallel replica (rank r of ``world_size`` sits at data
    rank ``r // (world_size / data_ranks)``)."""
    replicas = int(checkpoint.get("data_ranks") or len(states))
    return list(states[::max(len(states) // replicas, 1)])


@dataclass(frozen=True)
class FromRanks:
    """What rank r of M takes over of a per-rank part written by N ranks (N != M): the entries of
    the ranks k with k % M == r (``taken``: those to merge, none for r >= N), and ``own``, the
    entry of rank r % N (a state that cannot be merged, as an RNG state)."""

    taken: list[Any]
    own: Any

    @staticmethod
    def regroup(states: Sequence[Any], rank: int, world_size: int) -> FromRanks:
        return FromRanks([state for k, state in enumerate(states) if k % world_size == rank], states[rank % len(states)])


@dataclass(frozen=True)
class EndOfFit:
    """What a distributed fit leaves for a ``save_checkpoint`` after it returned: when its
    process group is gone, every rank's per-rank states at the end (rank 0 keeps them) and,
    brought back from spawned workers, the values and shared states only they held (the
    optimizers, schedulers, callbacks and loop; the weights come back on their own); when the
    group stays up, each rank's own states at the end (``own``: the save gathers them)."""

    per_rank: list[dict[str, Any]] | None
    values: dict[str, Any] | None = None
    shared: dict[str, Any] | None = None
    own: dict[str, Any] | None = None


# -- fw's pieces as parts ------------------------------------------------------------------------
@dataclass(frozen=True)
class Each:
    """A list of stateful objects (the optimizers, the schedulers) as one part: restored one to
    one or not at all (a partial restore would train on with some states fresh, saying nothing)."""

    items: Sequence[Any]
    what: str
    path: str = ""
    prepare: Callable[[Any, Any], Any] | None = None  # (state, item) -> the state to load (a renaming)

    def state_dict(self) -> list:
        return [item.state_dict() for item in self.items]

    def load_state_dict(self, states: list) -> None:
        check_count(states, self.items, self.what, self.path)
        for item, state in zip(self.items, states, strict=True):
            item.load_state_dict(state if self.prepare is None else self.prepare(state, item))


def check_count(states: Sequence[Any], items: Sequence[Any], what: str, path: str) -> None:
    """One saved state per item, or a CheckpointError (nothing is restored in part)."""
    if len(states) != len(items):
        raise CheckpointError(f"checkpoint '{path}' holds {len(states)} {what} state(s) and "
                              f"configure_optimizers() returned {len(items)}: resume with the "
                              "configure_optimizers() it was written with")


def items_of(part: Any) -> list:
    """The objects an ``Each`` part holds (the optimizers), or none."""
    return list(getattr(part, "items", []))


@dataclass(frozen=True)
class Callbacks:
    """The callbacks, each under its ``state_key``."""

    callbacks: Sequence[Any]

    def state_dict(self) -> dict:
        return {cb.state_key: cb.state_dict() for cb in self.callbacks}

    def load_state_dict(self, states: dict) -> None:
        for cb in self.callbacks:
            if states.get(cb.state_key):
                cb.load_state_dict(states[cb.state_key])


@dataclass(frozen=True)
class Value:
    """A part made of two functions (a piece of state that is not an object of its own)."""

    get: Callable[[], Any]
    put: Callable[[Any], None]

    def state_dict(self) -> Any:
        return self.get()

    def load_state_dict(self, state: Any) -> None:
        self.put(state)

    @staticmethod
    def saved_only(get: Callable[[], Any]) -> Value:
        """A part a strategy writes its own way (its loading counterpart is another part)."""
        return Value(get, _not_loaded)

    @staticmethod
    def loaded_only(put: Callable[[Any], None]) -> Value:
        """A part a strategy reads its own way (its saving counterpart is another part)."""
        return Value(_not_saved, put)


def _not_loaded(_: Any) -> None:
    raise AssertionError("a saving part is not loaded")


def _not_saved() -> Any:
    raise AssertionError("a loading part is not saved")
