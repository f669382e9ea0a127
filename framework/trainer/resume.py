"""Where the run stands and how to get back there: the training's position in its epoch
(``DataPosition``), the progress and position as checkpoint parts, the iterator a resumed epoch
continues from, and the checkpoints a fit refuses to continue.

Where the run stands is two things: the counters (``RunState``: epoch, ``global_step``,
``batches_that_stepped``) and the data position (``DataPosition``: how many batches of which
epoch are done, the RNG state when that epoch began, and, when a stop cut the epoch short, the
RNG state and metric aggregates right after its last batch). A checkpoint holds both as parts
(``progress_part``, ``position_parts``): resuming mid-epoch rebuilds the epoch's data order from
its starting RNG state, skips the batches already done (``continue_epoch``), then puts back the
RNG state of the moment the checkpoint was written, so the resumed run is bit for bit the run
that was never stopped.

That position is a count of batches per rank; on another number of ranks or another batch size
it is read as samples of the global order (``position_mapping.py``: a ``Carry``), and the epoch goes
on from that sample. Each rank then takes over the per-rank parts of the ranks it replaces
(``parts.FromRanks``): their metric aggregates merged, an RNG state of one of them.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from framework.checkpointing.parts import FromRanks, Stateful, Value
from framework.data.global_order import GlobalOrderSampler
from framework.data.sampler_injection import iterate_after
from framework.rank_zero import rank_zero_warn
from framework.seed import get_rng_state, set_rng_state
from framework.trainer.metric_merge import merge_aggregates

if TYPE_CHECKING:
    from framework.trainer.metric_collector import MetricCollector
    from framework.trainer.metrics import LoggedMetrics
    from framework.trainer.position_mapping import Carry
    from framework.trainer.run import Run
    from framework.trainer.state import RunState


@dataclass
class CutEpoch:
    """An epoch a stop ended early: the RNG state after its last trained batch, and its metric
    aggregates before the epoch end computed (and reset) them."""

    rng_after_last_batch: dict
    metrics: dict


@dataclass
class DataPosition:
    """Where the training stands in its data.

    Attributes:
        epoch: the epoch that ``batches`` and ``finished`` refer to.
        batches: batches of ``epoch`` already trained on (per rank).
        finished: ``epoch`` ran to its end and its epoch-end work is under way (the position
            moves to the start of the next epoch right after).
        epoch_start_rng: this rank's RNG state when ``epoch`` began (rebuilds its data order).
        cut: set when a stop cut the epoch short.
        validated: the epoch-end validation of ``epoch`` has run (its values are the run's).
        validated_values: from a checkpoint written at the end of that validation, its values,
            which the resumed epoch's end takes instead of validating again.
        resume_from: where a resumed fit continues (set from a checkpoint, taken by the first
            epoch).
    """

    epoch: int = 0
    batches: int = 0
    finished: bool = False
    epoch_start_rng: dict | None = None
    cut: CutEpoch | None = None
    validated: bool = False
    validated_values: dict | None = field(default=None, repr=False)
    resume_from: ResumePoint | None = field(default=None, repr=False)

    @property
    def mid_epoch(self) -> bool:
        """Some but not all batches of ``epoch`` are done: a checkpoint written now resumes inside it."""
        return self.batches > 0 and not self.finished

    def start(self, epoch: int) -> None:
        self.epoch, self.batches, self.finished, self.validated = epoch, 0, False, False
        self.epoch_start_rng, self.cut = get_rng_state(), None

    def cut_short(self, metrics: dict) -> None:
        """A stop ends the epoch before its end: keep the RNG state right after its last batch
        and its running metric aggregates, so that a checkpoint written from now on resumes at
        the next batch as if the run had never stopped."""
        self.cut = CutEpoch(get_rng_state(), metrics)

    def move_on(self, next_epoch: int) -> None:
        """The epoch was counted; a finished one moves the position to the next epoch's start."""
        if self.finished:
            self.epoch, self.batches, self.finished, self.validated = next_epoch, 0, False, False

    def continue_epoch(self, loader: Any, collector: MetricCollector, module: Any) -> tuple[Iterator, int]:
        """The epoch's iterator and first batch index: on a mid-epoch resume, after the batches
        the checkpoint had already trained on, with the epoch's metric aggregates continued."""
        resume, self.resume_from = self.resume_from, None
        if resume is None or not resume.batches:
            return iter(loader), 0
        iterator, self.batches = resume.iterate_from_position(loader)
        if resume.metrics:
            collector.load_state_dict(merge_aggregates(resume.metrics, module), module)
        return iterator, self.batches


@dataclass
class ResumePoint:
    """Where a resumed fit continues: the RNG state to put back once the sanity check has run,
    and on a mid-epoch resume the batches to skip and the RNG state after them."""

    rng: dict
    batches: int = 0
    rng_after_skip: dict | None = None
    metrics: list[dict] | None = None  # the epoch's running aggregates, of each rank taken over
    loader_state: dict | None = None  # a stateful training loader's own state_dict()
    samples: int | None = None  # on another shape: the samples of the epoch's global order done

    def restore_rng(self) -> None:
        set_rng_state(self.rng)

    def iterate_from_position(self, loader: Any) -> tuple[Iterator, int]:
        """An iterator over ``loader`` that starts after the batches already trained on, its
        first batch index, and the RNG state the checkpoint had at that point. A loader with
        ``load_state_dict`` (such as torchdata's StatefulDataLoader) resumes itself; on another
        shape the global order starts at the sample reached; others skip (``iterate_after``)."""
        batches = self.batches
        if self.samples is not None:
            batches = start_at_sample(loader, self.samples)
            iterator = iter(loader)
        elif self.loader_state is not None and callable(getattr(loader, "load_state_dict", None)):
            loader.load_state_dict(self.loader_state)
            iterator = iter(loader)
        else:
            iterator = iterate_after(loader, batches)
        if self.rng_after_skip is not None:
            set_rng_state(self.rng_after_skip)
        return iterator, batches


def start_at_sample(loader: Any, samples: int) -> int:
    """Start ``loader``'s next pass at sample ``samples`` of its global order; the index of the
    batch it begins with, counted so that the epoch's last batch keeps its index."""
    sampler = loader.sampler
    assert isinstance(sampler, GlobalOrderSampler), "position_mapping: only the global order carries over in samples"
    whole = len(loader)
    sampler.start_at(samples)
    return whole - len(loader)


# -- as checkpoint parts --------------------------------------------------------------------------
def progress_part(state: RunState, metrics: LoggedMetrics) -> Value:
    """The counters and the position, as one part (the file's ``loop`` entry): a fit resumed
    from it continues at the next epoch if the saved one had finished, else in its middle; one
    written at the end of the epoch-end validation also holds that validation's values."""
    position = state.position

    def saved() -> dict[str, Any]:
        progress: dict[str, Any] = {"epoch": position.epoch, "global_step": state.global_step,
                                    "batches_stepped": state.batches_that_stepped, "batches_done": position.batches,
                                    "epoch_finished": position.finished, "stop_reason": state.stop_reason}
        if position.validated and not position.finished:
            progress["epoch_end_validation"] = metrics.snapshot()
        return progress

    def load(saved: dict[str, Any]) -> None:
        state.global_step = int(saved["global_step"])
        state.batches_that_stepped = int(saved.get("batches_stepped", state.global_step))
        finished = bool(saved["epoch_finished"])
        state.epoch = position.epoch = int(saved["epoch"]) + (1 if finished else 0)
        position.batches = 0 if finished else int(saved["batches_done"])
        position.finished, position.cut = False, None
        position.validated_values = None if finished else saved.get("epoch_end_validation")
        state.should_stop, state.stop_reason = False, None

    return Value(saved, load)


def position_parts(run: Run, loaded: dict[str, Any]) -> dict[str, Stateful]:
    """This rank's own pieces of the position: its RNG states, and mid-epoch the epoch's metric
    aggregates so far and a stateful loader's position. What a checkpoint holds of them for this
    rank goes into ``loaded`` (``resume_point`` makes the point to continue from)."""
    position = run.state.position

    def rng() -> dict:  # a cut epoch resumes right after its last batch, whatever its epoch end drew since
        now = position.cut.rng_after_last_batch if position.cut is not None else get_rng_state()
        return {"now": now, "epoch_start": position.epoch_start_rng}

    def metrics() -> dict | None:
        if not position.mid_epoch:
            return None
        return position.cut.metrics if position.cut is not None else run.metrics.training.state_dict(run.module)

    def loader_state() -> dict | None:
        loaders = run.loaders.get("train") or []
        if not loaders or not position.mid_epoch or not callable(getattr(loaders[0], "state_dict", None)):
            return None
        return loaders[0].state_dict()

    return {key: Value(get, functools.partial(loaded.__setitem__, key))
            for key, get in (("rng", rng), ("metrics", metrics), ("loader_states", loader_state))}


def resume_point(run: Run, mine: dict[str, Any], ranks: int, carry: Carry | None) -> ResumePoint:
    """This rank's point to continue from (``mine``: its pieces from ``position_parts``, of a
    file written by ``ranks`` ranks; ``carry``: where another shape starts in the global order);
    mid-epoch, first the epoch-start RNG state, and the saved state once the batches already
    done are skipped."""
    rng, metrics, loader = mine["rng"], mine.get("metrics"), mine.get("loader_states")
    if isinstance(rng, FromRanks):
        rank_zero_warn(
            f"checkpoint was written by {ranks} rank(s), this run has {run.strategy.world_size}: rank r takes "
            f"the RNG states of rank r % {ranks}, so random draws (dropout) differ from the run that was never "
            f"stopped; resume on {ranks} process(es) for a bit-exact resume"
        )
        rng, loader = rng.own, None
    merged = metrics.taken if isinstance(metrics, FromRanks) else [metrics] if metrics else None
    batches = run.state.position.batches
    samples = carry.samples if carry is not None else None
    if batches and rng["epoch_start"] is not None:
        return ResumePoint(rng["epoch_start"], batches, rng["now"], merged, loader, samples)
    return ResumePoint(rng["now"], batches, metrics=merged, loader_state=loader, samples=samples)
