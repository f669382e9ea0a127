"""Lightning's own demo classes (``pytorch_lightning/demos/boring_classes.py``, its source as
installed) run on Lightning or, with only the imports changed, on fw: ``python boring_run.py
lightning|fw OUT``. Each case records the weights, the metrics and what Lightning code reads
from the Trainer during the run (``Probe``); tests/lightning/test_boring_classes.py compares the
two files."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import torch

FW_IMPORTS = {
    "from pytorch_lightning import LightningDataModule, LightningModule":
        "from framework import DataModule as LightningDataModule, TrainModule as LightningModule",
    "from pytorch_lightning.core.optimizer import LightningOptimizer": "from framework import LightningOptimizer",
    "from pytorch_lightning.utilities.types import STEP_OUTPUT": "from framework.types import STEP_OUTPUT",
}


def demo_classes(which: str) -> types.ModuleType:
    """Lightning's boring_classes module; for fw, its source with the imports changed only."""
    path = Path(importlib.util.find_spec("pytorch_lightning").origin).parent / "demos" / "boring_classes.py"
    source = path.read_text()
    if which == "fw":
        for theirs, ours in FW_IMPORTS.items():
            assert theirs in source, f"Lightning's demo no longer has: {theirs}"
            source = source.replace(theirs, ours)
    module = types.ModuleType(f"boring_{which}")
    exec(compile(source, str(path), "exec"), module.__dict__)
    return module


def probe_class(base: type) -> type:
    class Probe(base):
        """What Lightning code reads from the Trainer and the module, at the hooks it reads them."""

        def __init__(self):
            self.seen: dict[str, list] = {}

        def note(self, hook, trainer, module):
            progress = trainer.fit_loop.epoch_progress.current
            self.seen.setdefault(hook, []).append({
                "progress": (progress.ready, progress.started, progress.processed, progress.completed),
                "batch_idx": trainer.fit_loop.epoch_loop.batch_idx,
                "global_step": trainer.fit_loop.epoch_loop.global_step,
                "max_epochs": trainer.fit_loop.max_epochs, "max_steps": trainer.fit_loop.max_steps,
                "min_epochs": trainer.fit_loop.min_epochs,
                "num_training_batches": trainer.num_training_batches, "num_val_batches": trainer.num_val_batches,
                "num_sanity_val_batches": trainer.num_sanity_val_batches, "val_check_batch": trainer.val_check_batch,
                "enable_validation": trainer.enable_validation, "evaluating": trainer.evaluating,
                "precision": trainer.precision, "sampler": trainer.distributed_sampler_kwargs,
                "sigterm": trainer.received_sigterm, "limits": (trainer.limit_train_batches,
                                                                trainer.limit_val_batches, trainer.limit_test_batches,
                                                                trainer.limit_predict_batches),
                "val_check_interval": trainer.val_check_interval, "on_gpu": module.on_gpu,
                "strict_loading": module.strict_loading, "dtype": str(next(module.parameters()).dtype),
                "scaler": trainer.scaler is not None,
            })

        def on_train_epoch_start(self, trainer, module):
            self.note("on_train_epoch_start", trainer, module)

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if batch_idx == 0:
                self.note("on_train_batch_end", trainer, module)

        def on_validation_start(self, trainer, module):
            self.note("on_validation_start", trainer, module)

        def on_train_epoch_end(self, trainer, module):
            self.note("on_train_epoch_end", trainer, module)

        def on_test_start(self, trainer, module):
            self.seen.setdefault("on_test_start", []).append(trainer.num_test_batches)

        def on_predict_start(self, trainer, module):
            self.seen.setdefault("on_predict_start", []).append(trainer.num_predict_batches)

    return Probe


def run_cases(which: str) -> dict:
    if which == "lightning":
        import pytorch_lightning as pl
        Trainer, Callback, seed = pl.Trainer, pl.Callback, pl.seed_everything
    else:
        import framework as fw
        Trainer, Callback, seed = fw.Trainer, fw.Callback, fw.seed_everything
    demo = demo_classes(which)
    Probe = probe_class(Callback)

    class Logged(demo.BoringModel):
        """The demo model with its losses logged: the validation and test data are Lightning's."""

        def validation_step(self, batch, batch_idx):
            out = super().validation_step(batch, batch_idx)
            self.log("val_loss", out["x"])
            return out

        def test_step(self, batch, batch_idx):
            out = super().test_step(batch, batch_idx)
            self.log("test_loss", out["y"])
            return out

    quiet = dict(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                 enable_model_summary=False, use_distributed_sampler=False)

    def case(model_cls, datamodule_cls=None, stages=("fit",), **trainer_args):
        seed(3)
        model, probe = model_cls(), Probe()
        datamodule = datamodule_cls() if datamodule_cls is not None else None
        trainer = Trainer(callbacks=[probe], **{**quiet, **trainer_args})
        before = {"limits": (trainer.limit_train_batches, trainer.limit_val_batches),
                  "val_check_interval": trainer.val_check_interval, "precision": trainer.precision}
        out = {"before": before}
        for stage in stages:
            result = getattr(trainer, stage)(model, datamodule=datamodule)
            if stage == "predict":
                out["predict"] = torch.cat(result)
            elif stage != "fit":
                out[stage] = result
        after = trainer.fit_loop.epoch_progress.current
        out.update(state={k: v.clone() for k, v in model.state_dict().items()}, seen=probe.seen,
                   step=trainer.global_step, epoch=trainer.current_epoch,
                   after=(after.ready, after.started, after.processed, after.completed),
                   metrics={k: float(v) for k, v in trainer.callback_metrics.items()},
                   datamodule_trainer=datamodule is None or datamodule.trainer is trainer)
        return out

    return {
        "boring": case(Logged, stages=("fit", "validate", "test", "predict"), max_epochs=2),
        "datamodule": case(Logged, demo.BoringDataModule, stages=("fit", "test", "predict"), max_steps=80),
        "manual": case(demo.ManualOptimBoringModel, max_epochs=1, limit_val_batches=4),
        "demo": case(demo.DemoModel, demo.BoringDataModule, max_epochs=1),
        "no_len": case(demo.BoringModel, demo.BoringDataModuleNoLen, stages=("fit", "test"), max_epochs=1,
                       limit_train_batches=40, limit_val_batches=8, limit_test_batches=8),
        "64-true": case(demo.BoringModel, max_epochs=1, precision="64-true", limit_val_batches=8),
        "bf16-true": case(demo.BoringModel, max_epochs=1, precision="bf16-true", limit_val_batches=8),
        "interval": case(demo.BoringModel, max_epochs=1, val_check_interval=0.25, limit_val_batches=2),
    }


if __name__ == "__main__":
    torch.save(run_cases(sys.argv[1]), sys.argv[2])
