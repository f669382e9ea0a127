"""Where the training stands in its data (``DataPosition``), and the point a resumed fit
continues from (``ResumePoint``).

The position is how many batches of which epoch are done, the RNG state when that epoch began,
and, when a stop cut the epoch short, the RNG state and metric aggregates right after its last
batch. The loops move it on (``training_epoch.py``: ``continue_epoch``, ``cut_short``) and
``RunState`` holds it (``state.position``); the Trainer saves it in a checkpoint and reads it back
into a ``ResumePoint`` (``framework/trainer/resume.py``: the progress and position as checkpoint
parts), so that a resumed epoch skips the batches already done and puts the RNG state back as
the run that was never stopped had it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from framework.data.global_order import GlobalOrderSampler
from framework.data.sampler_injection import iterate_after
from framework.run_state.metric_merge import merge_aggregates
from framework.seed import get_rng_state, set_rng_state

if TYPE_CHECKING:
    from framework.run_state.metric_collector import MetricCollector


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
