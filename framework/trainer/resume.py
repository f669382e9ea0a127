"""How the run gets back to where it stood: the progress and position as checkpoint parts, and
the point a resumed fit continues from.

Where the run stands is two things: the counters (``RunState``: epoch, ``global_step``,
``batches_that_stepped``) and the data position (``framework/run_state/position.py``:
``DataPosition``, how many batches of which epoch are done, the RNG state when that epoch began,
and, when a stop cut the epoch short, the RNG state and metric aggregates right after its last
batch). A checkpoint holds both as parts (``progress_part``, ``position_parts``): resuming
mid-epoch rebuilds the epoch's data order from its starting RNG state, skips the batches already
done (``DataPosition.continue_epoch``, from the ``ResumePoint`` that ``resume_point`` makes), then
puts back the RNG state of the moment the checkpoint was written, so the resumed run is bit for
bit the run that was never stopped.

That position is a count of batches per rank; on another number of ranks or another batch size
it is read as samples of the global order (``position_mapping.py``: a ``Carry``), and the epoch goes
on from that sample. Each rank then takes over the per-rank parts of the ranks it replaces
(``parts.FromRanks``): their metric aggregates merged, an RNG state of one of them.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from framework.checkpointing.parts import FromRanks, Stateful, Value
from framework.rank_zero import rank_zero_warn
from framework.run_state.position import ResumePoint
from framework.seed import get_rng_state

if TYPE_CHECKING:
    from framework.run_state.metrics import LoggedMetrics
    from framework.run_state.state import RunState
    from framework.trainer.position_mapping import Carry
    from framework.trainer.run import Run


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
