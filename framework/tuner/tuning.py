"""``Tuner``: Lightning's ``pytorch_lightning.tuner.Tuner`` for fw, with its arguments and
defaults: ``lr_find`` (a learning-rate range test) and ``scale_batch_size`` (the largest batch
size that fits in memory). Each runs the Trainer's own calls as trials (``trials.py``) and leaves
the module's weights, the Trainer and the random streams as they were; what it changes is the
tuned value on the module (or DataModule), when asked to.

::

    tuner = Tuner(trainer)
    finder = tuner.lr_find(model)            # model.lr (or learning_rate) set to the suggestion
    finder.plot(suggest=True).savefig("lr.png")
    tuner.scale_batch_size(model, mode="binsearch")   # model.batch_size set to what fits
    trainer.fit(model)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from framework.data import DataModule
from framework.errors import ConfigError, did_you_mean
from framework.rank_zero import rank_zero_info, rank_zero_warn
from framework.tuner import batch_size, lr_sweep
from framework.tuner.attributes import TunedValue
from framework.tuner.lr_finder import MODES, LRFinder
from framework.tuner.trials import Trials

if TYPE_CHECKING:
    from framework.module import TrainModule
    from framework.trainer import Trainer

METHODS = ("fit", "validate", "test", "predict")


class Tuner:
    """Tunes a module's learning rate and batch size on ``trainer``, one process only."""

    def __init__(self, trainer: Trainer) -> None:
        self._trainer = trainer

    def lr_find(self, model: TrainModule, train_dataloaders: Any = None, val_dataloaders: Any = None,
                dataloaders: Any = None, datamodule: DataModule | None = None, method: str = "fit",
                min_lr: float = 1e-8, max_lr: float = 1, num_training: int = 100, mode: str = "exponential",
                early_stop_threshold: float | None = 4.0, update_attr: bool = True,
                attr_name: str = "") -> LRFinder | None:
        """Train ``num_training`` steps with the learning rate rising from ``min_lr`` to ``max_lr``
        and record the loss at each, as Lightning's range test does.

        Args:
            model: the module; its weights are put back afterwards.
            train_dataloaders, val_dataloaders, datamodule: the data, as for ``trainer.fit``.
            dataloaders: for the other methods only; must be None.
            method: ``"fit"``, the only one the finder runs.
            min_lr, max_lr, num_training: the rates and the number of steps between them.
            mode: ``"exponential"`` or ``"linear"`` growth of the rate.
            early_stop_threshold: stop once the smoothed loss exceeds this times the best one
                (None: never).
            update_attr: set the suggestion (``suggestion()``) on the module's ``lr`` or
                ``learning_rate`` (``attr_name`` names another), in ``hparams`` and on the
                DataModule too where the name is.

        Returns:
            The ``LRFinder`` (``results``, ``suggestion()``, ``plot()``), or None under
            ``fast_dev_run`` (the finder is skipped, with a warning, as in Lightning).

        Raises:
            ConfigError: another method, dataloaders given, an unknown mode, no learning-rate
                attribute to update, several optimizers, or a multi-process strategy.
        """
        if method != "fit":
            raise ConfigError(f"lr_find: method={method!r}: the learning rate finder runs 'fit' only")
        train_dataloaders, _, datamodule = _check_call(self._trainer, "lr_find", method, train_dataloaders,
                                                       val_dataloaders, dataloaders, datamodule)
        mode = _one_of("lr_find", "mode", str(mode).lower(), MODES)
        _positive("lr_find", "num_training", num_training)
        if self._trainer.settings.fast_dev_run:
            rank_zero_warn("lr_find: skipped, as fast_dev_run is on (as in Lightning)")
            return None
        value = _lr_value(model, datamodule, attr_name) if update_attr else None
        finder = LRFinder(mode, min_lr, max_lr, num_training)
        with Trials(self._trainer, model, datamodule) as trials:
            lr_sweep.sweep(trials, finder, early_stop_threshold, train_dataloaders, val_dataloaders)
        if value is not None:
            lr = finder.suggestion()
            if lr is not None:
                value.set(lr)
                rank_zero_info(f"fw lr_find: learning rate set to {lr} ({value.name})")
        return finder

    def scale_batch_size(self, model: TrainModule, train_dataloaders: Any = None, val_dataloaders: Any = None,
                         dataloaders: Any = None, datamodule: DataModule | None = None, method: str = "fit",
                         mode: str = "power", steps_per_trial: int = 3, init_val: int = 2, max_trials: int = 25,
                         batch_arg_name: str = "batch_size", margin: float = 0.05, max_val: int = 8192) -> int | None:
        """Find the largest batch size whose trials do not run out of memory, as Lightning's
        does (``batch_size.py``: the modes, and where fw deliberately differs), and set it.

        Args:
            model: the module; its weights are put back afterwards.
            train_dataloaders: must be None (or a DataModule): the module or DataModule builds the
                loaders, from the batch size the search sets.
            val_dataloaders, datamodule: as for ``trainer.fit``; dataloaders: must be None.
            method: the call the trials run: ``fit``, ``validate``, ``test`` or ``predict``.
            mode: ``"power"`` (double until out of memory) or ``"binsearch"`` (then bisect).
            steps_per_trial: optimizer steps (fit) or batches (the others) per trial.
            init_val, max_trials, max_val: the first size, the most trials, the largest size.
            batch_arg_name: where the batch size is: an attribute of the module, a key of its
                ``hparams``, an attribute of the DataModule or a key of its ``hparams`` (all set).
            margin: ``binsearch`` only: the result is reduced by this fraction (0 <= margin < 1).

        Returns:
            The batch size found (also set on the module / DataModule), or None under
            ``fast_dev_run`` (skipped, with a warning, as in Lightning).

        Raises:
            ConfigError: loaders given directly, no ``batch_arg_name``, a wrong argument, several
                loaders for an evaluation method, or a multi-process strategy.
        """
        datamodule = _check_batch_size_call(self._trainer, method, train_dataloaders, val_dataloaders, dataloaders,
                                            datamodule)
        mode = _one_of("scale_batch_size", "mode", str(mode).lower(), batch_size.MODES)
        for name, number in (("steps_per_trial", steps_per_trial), ("init_val", init_val),
                             ("max_trials", max_trials), ("max_val", max_val)):
            _positive("scale_batch_size", name, number)
        if not 0.0 <= margin < 1.0:
            raise ConfigError(f"scale_batch_size: margin={margin!r}: use a fraction with 0 <= margin < 1")
        value = TunedValue(batch_arg_name, model, datamodule)
        if not value.exists():
            raise ConfigError(f"scale_batch_size: batch_arg_name={batch_arg_name!r} is not an attribute of "
                              f"{type(model).__name__} or a key of its hparams, nor of the DataModule's: give the "
                              "name its *_dataloader() reads the batch size from")
        if value.in_both_module_places():
            rank_zero_warn(f"scale_batch_size: {type(model).__name__} has '{batch_arg_name}' as an attribute and in "
                           "hparams: the attribute is the initial batch size (as in Lightning); both are set")
        if self._trainer.settings.fast_dev_run:
            rank_zero_warn("scale_batch_size: skipped, as fast_dev_run is on (as in Lightning)")
            return None
        with Trials(self._trainer, model, datamodule) as trials:
            size = _search(trials, value, method, mode, val_dataloaders, steps_per_trial, init_val, max_trials,
                           margin, max_val)
        rank_zero_info(f"fw scale_batch_size: finished, batch size {size} ({batch_arg_name})")
        return size


def _search(trials: Trials, value: TunedValue, method: str, mode: str, val: Any, steps_per_trial: int,
            init_val: int, max_trials: int, margin: float, max_val: int) -> int:
    """A call of no steps reads the data set's length, then the trials run as Lightning's."""
    stage = "train" if method == "fit" else method
    probe = batch_size.DatasetLength(stage)
    if method == "fit":
        trials.call(method, [probe], val=val, max_steps=0)
    else:
        trials.call(method, [probe], limits={method: 0})
    if method != "fit" and probe.loaders > 1:
        raise ConfigError(f"scale_batch_size: method={method!r} runs on {probe.loaders} loaders; the search sizes "
                          "one: return a single loader (as Lightning requires)")

    def run_trial() -> None:
        if method == "fit":  # every training batch; validation on as many batches as steps
            trials.call(method, [], val=val, max_steps=steps_per_trial,
                       limits={"train": None, "validate": steps_per_trial})
        else:
            trials.call(method, [], limits={method: steps_per_trial})

    search = batch_size.BatchSizeSearch(value, batch_size.trial_fn(run_trial), probe.length, max_val)
    size = search.set_up(init_val)
    return search.power(size, max_trials) if mode == "power" else search.binsearch(size, max_trials, margin)


def _check_call(trainer: Trainer, what: str, method: str, train_dataloaders: Any, val_dataloaders: Any,
                dataloaders: Any, datamodule: DataModule | None) -> tuple[Any, Any, DataModule | None]:
    """Lightning's ``_check_tuner_configuration``, and the refusal of several processes; the
    loaders and the DataModule (which may come as ``train_dataloaders`` or ``dataloaders``)."""
    _one_of(what, "method", method, METHODS)
    if trainer.strategy.multi_process:
        raise ConfigError(f"{what}: trainer.strategy={trainer.strategy.name!r} runs one process per device, and the "
                          "Tuner tunes in one: tune with a Trainer on one device (devices=1), then pass the value "
                          "to the distributed Trainer")
    if isinstance(train_dataloaders, DataModule):
        train_dataloaders, datamodule = None, _one_datamodule(train_dataloaders, datamodule)
    if isinstance(dataloaders, DataModule):
        dataloaders, datamodule = None, _one_datamodule(dataloaders, datamodule)
    if method == "fit" and dataloaders is not None:
        raise ConfigError(f"{what}: with method='fit', give train_dataloaders= and val_dataloaders=, not dataloaders=")
    if method != "fit" and (train_dataloaders is not None or val_dataloaders is not None):
        raise ConfigError(f"{what}: with method={method!r}, give dataloaders=, not train_dataloaders= or "
                          "val_dataloaders=")
    return train_dataloaders, dataloaders, datamodule


def _check_batch_size_call(trainer: Trainer, method: str, train_dataloaders: Any, val_dataloaders: Any,
                           dataloaders: Any, datamodule: DataModule | None) -> DataModule | None:
    train, dataloaders, datamodule = _check_call(trainer, "scale_batch_size", method, train_dataloaders,
                                                 val_dataloaders, dataloaders, datamodule)
    for name, given in (("train_dataloaders", train), ("dataloaders", dataloaders)):
        if given is not None:
            raise ConfigError(f"scale_batch_size: {name}= was given, whose batch size the search cannot change: let "
                              "the module's (or a DataModule's) *_dataloader() build the loaders from the batch size "
                              "(Lightning refuses this too)")
    return datamodule


def _lr_value(model: TrainModule, datamodule: DataModule | None, attr_name: str) -> TunedValue:
    """Lightning's ``_determine_lr_attr_name``: ``attr_name``, else ``lr``, else ``learning_rate``."""
    for name in (attr_name,) if attr_name else ("lr", "learning_rate"):
        value = TunedValue(name, model, datamodule)
        if value.exists():
            return value
    wanted = repr(attr_name) if attr_name else "'lr' or 'learning_rate'"
    raise ConfigError(f"lr_find: {type(model).__name__} has no attribute {wanted}, nor its hparams (nor the "
                      "DataModule's): name the one configure_optimizers() reads with attr_name=..., or pass "
                      "update_attr=False")


def _one_datamodule(given: DataModule, datamodule: DataModule | None) -> DataModule:
    if datamodule is not None:
        raise ConfigError("a DataModule was given twice (positionally and as datamodule=); pass it once")
    return given


def _one_of(what: str, name: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ConfigError(f"{what}: {name}={value!r}: use one of {', '.join(choices)}{did_you_mean(value, choices)}")
    return value


def _positive(what: str, name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{what}: {name}={value!r}: must be an integer >= 1")
