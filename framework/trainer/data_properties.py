"""The Trainer's properties about the data, with Lightning's names: the current (or last) call's
loaders, the batches per loader of the last call of each kind (as Lightning's loops keep theirs
from one call to the next; a fit's from its loaders), the training and stepping batches of a fit,
when validation runs inside an epoch, and how a sampler shards the data over the job."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from framework.run_state.state import RunState
    from framework.strategies import Strategy
    from framework.trainer.run import Run
    from framework.trainer.settings import Settings


class DataProperties:
    """Mixed into ``Trainer``."""

    settings: Settings
    strategy: Strategy
    state: RunState
    run: Run | None
    last_fit: Run | None
    batch_counts: dict[str, list[int | float]]

    @property
    def enable_validation(self) -> bool:
        """Lightning's: the module has a ``validation_step`` and validation data (given, or a
        ``val_dataloader()``), and ``limit_val_batches`` is not 0."""
        from framework.data import DataModule
        from framework.loops.hooks import overrides
        from framework.module import TrainModule

        run = self.run
        if run is None or not overrides(run.module, TrainModule, "validation_step") \
                or self.settings.limits["validate"] == 0:
            return False
        source = run.loader_source
        given = source is not None and source.given.get("validate") is not None
        defined = overrides(run.datamodule, DataModule, "val_dataloader") if run.datamodule is not None \
            else overrides(run.module, TrainModule, "val_dataloader")
        return bool(run.loaders.get("validate")) or given or defined

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int] | None:
        """How a sampler shards the data over this job (None in one process)."""
        strategy = self.strategy
        if not strategy.multi_process:
            return None
        return {"num_replicas": strategy.data_parallel_size, "rank": strategy.data_parallel_rank}

    # -- the data: the loaders are the current (or last) call's; the batch counts, as Lightning's loops
    # keep theirs from one call to the next, the last call's of that kind (the fit's from its loaders)
    def _loaders_of(self, key: str) -> Any:
        found = (self.run.loaders.get(key) if self.run is not None else None) or []
        return found[0] if len(found) == 1 else (found or None)

    @property
    def train_dataloader(self) -> Any:
        """The current (or last) call's training loader (None without one)."""
        return self._loaders_of("train")

    @property
    def val_dataloaders(self) -> Any:
        """The current (or last) call's validation loader, a list of them for several, or None."""
        return self._loaders_of("validate")

    @property
    def test_dataloaders(self) -> Any:
        """The current (or last) call's test loader, a list of them for several, or None."""
        return self._loaders_of("test")

    @property
    def predict_dataloaders(self) -> Any:
        """The current (or last) call's prediction loader, a list of them for several, or None."""
        return self._loaders_of("predict")

    def _batches_per_loader(self, fn: str, stage: str) -> list[int | float]:
        """Batches per ``stage`` loader of the last ``fn`` call (the current one, if it is one):
        a fit's from its loaders (reloaded ones too), the others' as their set-up counted them."""
        from framework.loops.batches import num_batches

        if fn != "fit":
            return list(self.batch_counts.get(fn, []))
        loaders = (self.last_fit.loaders.get(stage) if self.last_fit is not None else None) or []
        return [num_batches(loader, self.settings.limits[stage]) for loader in loaders]

    @property
    def num_val_batches(self) -> list[int | float]:
        """Validation batches per loader (Lightning's list): in a ``validate`` call and after it
        (until the next call) that call's, else the last fit's."""
        return self._batches_per_loader("validate" if self.state.fn == "validate" else "fit", "validate")

    @property
    def num_sanity_val_batches(self) -> list[int | float]:
        """The last fit's sanity check's batches per validation loader."""
        steps = self.settings.num_sanity_val_steps
        return [min(float("inf") if steps == -1 else steps, n)  # -1: all of them
                for n in self._batches_per_loader("fit", "validate")]

    @property
    def num_test_batches(self) -> list[int | float]:
        """Test batches per loader of the last ``test`` call (``inf`` for a loader without a length)."""
        return self._batches_per_loader("test", "test")

    @property
    def num_predict_batches(self) -> list[int | float]:
        """Prediction batches per loader of the last ``predict`` call (as ``num_test_batches``)."""
        return self._batches_per_loader("predict", "predict")

    @property
    def num_training_batches(self) -> float:
        """Training batches per epoch of the last fit (``inf`` before its training starts, or
        for a loader without a length), as Lightning reports them."""
        found = self.last_fit.fit_batches if self.last_fit is not None else None
        return math.inf if found is None else found

    @property
    def estimated_stepping_batches(self) -> float:
        """Optimizer steps the fit will take at most (``inf`` without a bound), from the
        training loader's length, the limits and accumulation: for sizing LR schedules in
        ``configure_optimizers``."""
        from framework.loops.batches import num_batches

        settings = self.settings
        loaders = self.run.loaders.get("train") if self.run is not None else None
        if not loaders and (fit := self.last_fit) is not None:  # after a fit: its loader's, as Lightning's
            loaders = fit.loaders.get("train")
        if not loaders:
            return math.inf if settings.max_steps == -1 else float(settings.max_steps)
        per_epoch = num_batches(loaders[0], settings.limits["train"])
        steps = math.ceil(per_epoch / settings.accumulate_grad_batches) * max(settings.max_epochs, 1) \
            if not math.isinf(per_epoch) and settings.max_epochs != -1 else math.inf
        if settings.max_steps != -1:
            steps = min(steps, settings.max_steps)
        return steps

    @property
    def val_check_batch(self) -> int | float | None:
        """Training batches between validations inside an epoch (None before a fit's training
        starts; the last fit's after it, as in Lightning)."""
        limit = self.last_fit.fit_batches if self.last_fit is not None else None
        if limit is None:  # as Lightning: known once a fit's training starts
            return None
        interval = self.settings.val_check_interval
        if interval is None or (isinstance(interval, float) and interval == 1.0):
            return limit
        return max(1, int(limit * interval)) if isinstance(interval, float) else int(interval)
