"""A run stopped in the middle of an epoch by ``max_steps``, ``max_time`` or a callback's
``should_stop`` records the epoch as unfinished; resumed with a larger limit, it ends with the
parameters (bit for bit) and the logged scalars of a run that was never stopped."""

from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F
import torchmetrics
from torch import nn
from toy import RecordingLogger, loader, regression_data

import framework as fw
from framework.checkpointing.file import load_checkpoint

BATCHES = 5  # per epoch
STOP_AT = 7  # global step: batch 2 of epoch 1


class Net(fw.TrainModule):
    """Dropout, Adam, an epoch-interval StepLR, a step+epoch logged loss and a torchmetrics
    epoch metric: every piece of state a resume has to continue."""

    def __init__(self, sleep_at_step: int | None = None):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))
        self.mae = torchmetrics.MeanAbsoluteError()
        self.sleep_at_step = sleep_at_step

    def training_step(self, batch, batch_idx):
        if self.global_step + 1 == self.sleep_at_step:
            time.sleep(1.2)  # this step runs past max_time
        x, y = batch
        out = self.net(x)
        loss = F.mse_loss(out, y)
        self.mae(out.detach(), y)
        self.log("train/loss", loss, on_step=True, on_epoch=True)
        self.log("train/mae", self.mae, on_step=False, on_epoch=True)
        return loss

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=0.01)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)}


class StopAt(fw.Callback):
    def __init__(self, step):
        self.step = step

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            trainer.should_stop = True


def fit(root, *, ckpt=None, callbacks=(), model_args=None, **limits):
    fw.seed_everything(5)
    model = Net(**(model_args or {}))
    rows = RecordingLogger()
    trainer = fw.Trainer(accelerator="cpu", devices=1, logger=rows, enable_checkpointing=False,
                         enable_progress_bar=False, log_every_n_steps=1, default_root_dir=str(root),
                         callbacks=list(callbacks), **limits)
    trainer.fit(model, loader(regression_data(BATCHES * 8, seed=3), 8, shuffle=True), ckpt_path=ckpt)
    return trainer, model, rows.rows


def step_rows(rows):
    return [(s, m) for s, m in rows if "train/loss_step" in m]


def epoch_rows(rows):
    return [(s, m) for s, m in rows if "train/loss_epoch" in m]


STOPS = {
    "max_steps": dict(limits={"max_steps": STOP_AT}),
    "max_time": dict(limits={"max_epochs": 3, "max_time": 1.0}, model_args={"sleep_at_step": STOP_AT}),
    "should_stop": dict(limits={"max_epochs": 3}, callbacks=[StopAt(STOP_AT)]),
}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", list(STOPS))
def test_a_run_stopped_mid_epoch_resumes_exactly(tmp_path, kind):
    spec = STOPS[kind]
    _, straight, straight_rows = fit(tmp_path / "straight", max_epochs=3)

    stopped_trainer, _, stopped_rows = fit(tmp_path / "stopped", model_args=spec.get("model_args"),
                                           callbacks=spec.get("callbacks", ()), **spec["limits"])
    assert stopped_trainer.global_step == STOP_AT and stopped_trainer.state.stop_reason == kind
    path = tmp_path / "stopped.ckpt"
    stopped_trainer.save_checkpoint(path)
    saved = load_checkpoint(path)
    assert saved["loop"]["epoch"] == 1 and saved["loop"]["batches_done"] == 2
    assert not saved["loop"]["epoch_finished"]
    # the epoch-interval scheduler stepped for the finished epoch 0 only
    assert saved["optimizer_states"][0]["param_groups"][0]["lr"] == pytest.approx(0.005)

    resumed_trainer, resumed, resumed_rows = fit(tmp_path / "resumed", ckpt=str(path), max_epochs=3)
    assert resumed_trainer.global_step == 3 * BATCHES
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    # the step rows of both halves are the uninterrupted run's
    assert step_rows(stopped_rows) + step_rows(resumed_rows) == step_rows(straight_rows)
    # so are the epoch rows of every finished epoch, the cut one included (its aggregates
    # continued from the checkpoint); the stopped run's row for the cut epoch is its own
    assert epoch_rows(stopped_rows)[:1] + epoch_rows(resumed_rows) == epoch_rows(straight_rows)


DDP_SCRIPT = """
import json, sys, time
import torch, torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
import framework as fw
import framework.callbacks as fw_callbacks
from framework.loggers import Logger

out, stop_at, kinds = sys.argv[1], int(sys.argv[2]), sys.argv[3:]

class Rows(Logger):
    def __init__(self):
        super().__init__(name="")
        self.rows = []
    def log_metrics(self, metrics, step):
        self.rows.append([step, {k: float(v) for k, v in metrics.items()}])
    def log_hyperparams(self, params):
        pass

class Net(fw.TrainModule):
    def __init__(self, kind):
        super().__init__()
        torch.manual_seed(0)
        self.kind = kind
        self.net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))
    def training_step(self, batch, batch_idx):
        if self.kind == "max_time" and self.global_step + 2 == stop_at:  # the batch before the stop:
            time.sleep(2.5)  # its check's answer is read after the next batch (StopCheck.after_batch)
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        self.log("train/loss", loss, on_step=True, on_epoch=True, sync_dist=True)
        return loss
    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=0.01)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)}

class StopAt(fw.Callback):
    def __init__(self, kind):
        self.kind = kind
    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if self.kind == "should_stop" and trainer.global_step == stop_at:
            trainer.should_stop = True

def run(name, kind, ckpt=None):
    limits = {"max_epochs": 3}
    if name == "stopped":
        limits = {"max_steps": stop_at} if kind == "max_steps" else {"max_epochs": 3, "max_time": 2.0} if kind == "max_time" else limits
    fw.seed_everything(5)
    g = torch.Generator().manual_seed(3)
    data = TensorDataset(torch.randn(200, 4, generator=g), torch.randn(200, 1, generator=g))
    rows = Rows()
    # the stopped run keeps last.ckpt, written at the end of the cut epoch with every rank's state
    callbacks = [StopAt(kind), fw_callbacks.ModelCheckpoint(dirpath=f"{out}/{kind}/ck", save_top_k=0, save_last=True)]
    trainer = fw.Trainer(accelerator="cpu", devices=2, strategy="ddp_gloo", logger=rows, enable_progress_bar=False,
                         log_every_n_steps=1, callbacks=callbacks if name == "stopped" else [],
                         enable_checkpointing=name == "stopped", **limits)
    model = Net(kind)
    trainer.fit(model, DataLoader(data, batch_size=4, shuffle=True), ckpt_path=ckpt)
    with open(f"{out}/{kind}_{name}_rank{trainer.global_rank}.json", "w") as f:
        json.dump({"step": trainer.global_step, "reason": trainer.state.stop_reason, "rows": rows.rows,
                   "w": [p.detach().flatten().tolist() for p in model.parameters()]}, f)

# one job for every case: the uninterrupted run (it does not depend on the kind of stop:
# max_time's slow step changes no number), then each kind's stopped and resumed runs
run("straight", "none")
for kind in kinds:
    run("stopped", kind)
    run("resumed", kind, f"{out}/{kind}/ck/last.ckpt")
"""

DDP_STOP_AT = 25 + 20  # 25 batches per epoch; batch 20 of epoch 1 (max_time is read every 20 batches,
# asked after batch 19 and answered after batch 20)


@pytest.fixture(scope="module")
def ddp_runs(tmp_path_factory):
    """Every kind of stop on 2 Gloo ranks, in one job of ranks forked from this process with
    torchrun's variables (tests/forked.py: no launcher is under test here): {(kind, name): [rank 0, rank 1]}."""
    import json

    import forked
    from distributed.helpers import check_ok, write_script

    out = tmp_path_factory.mktemp("ddp_stops")
    check_ok(forked.run_script(write_script(out, DDP_SCRIPT), str(out), str(DDP_STOP_AT), *STOPS, nprocs=2,
                               timeout=150))
    runs = {("none", "straight"): [json.loads((out / f"none_straight_rank{r}.json").read_text()) for r in (0, 1)]}
    for kind in STOPS:
        for name in ("stopped", "resumed"):
            runs[kind, name] = [json.loads((out / f"{kind}_{name}_rank{r}.json").read_text()) for r in (0, 1)]
    return runs


@pytest.mark.timeout(90)  # the first one runs the job (~20 s)
@pytest.mark.parametrize("kind", list(STOPS))
def test_a_run_stopped_mid_epoch_on_two_gloo_ranks_resumes_exactly(ddp_runs, kind):
    stop_at = DDP_STOP_AT
    result = {"stopped": ddp_runs[kind, "stopped"], "resumed": ddp_runs[kind, "resumed"],
              "straight": ddp_runs["none", "straight"]}
    assert [r["step"] for r in result["stopped"]] == [stop_at, stop_at]
    assert result["stopped"][0]["reason"] == kind
    for rank in (0, 1):
        assert result["resumed"][rank]["w"] == result["straight"][rank]["w"], f"rank {rank}"
    rows = {name: [tuple(row) for row in result[name][0]["rows"]] for name in result}
    assert step_rows(rows["stopped"]) + step_rows(rows["resumed"]) == step_rows(rows["straight"])
    assert epoch_rows(rows["stopped"])[:1] + epoch_rows(rows["resumed"]) == epoch_rows(rows["straight"])
