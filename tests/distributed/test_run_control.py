"""Ranks that start at different times still stop at the same batch under ``max_time`` (a
mismatch would abort Gloo), and ``save_checkpoint`` works after a distributed fit has ended."""

from __future__ import annotations

import json

import pytest
import torch
from forked import run_script

from framework.checkpointing.file import load_checkpoint

from .helpers import check_ok, write_script

SCRIPT = """
import json, sys, time
import torch
from torch.utils.data import DataLoader
import framework as fw
import workload

out = sys.argv[1]

class Slow(workload.Regressor):
    def training_step(self, batch, batch_idx):
        time.sleep(0.01)
        return super().training_step(batch, batch_idx)

trainer = fw.Trainer(devices=2, strategy="ddp_gloo", max_epochs=1000, max_time=1.5, **workload.FIT_ARGS)
if trainer.global_rank == 1:
    time.sleep(1.0)  # rank 1's clock starts a second later than rank 0's
model = Slow()
trainer.fit(model, DataLoader(workload.regression_data(64), batch_size=4))
trainer.save_checkpoint(f"{out}/after_fit.ckpt")  # the process group is gone by now
with open(f"{out}/rank{trainer.global_rank}.json", "w") as f:
    json.dump({"step": trainer.global_step, "epoch": trainer.current_epoch,
               "w": torch.cat([p.flatten() for p in model.parameters()]).tolist()}, f)
"""


@pytest.mark.timeout(60)
def test_max_time_stops_every_rank_at_the_same_step_and_checkpoint_after_fit(tmp_path):
    check_ok(run_script(write_script(tmp_path, SCRIPT), str(tmp_path), nprocs=2, timeout=45))
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    assert r0["step"] == r1["step"] > 0 and r0["w"] == r1["w"]
    assert r0["epoch"] < 1000  # max_time, not max_epochs, ended it
    ckpt = load_checkpoint(tmp_path / "after_fit.ckpt")
    assert ckpt["global_step"] == r0["step"]


FAILED_WRITE = """
import json, sys
from torch.utils.data import DataLoader
import framework as fw
import workload

out = sys.argv[1]
trainer = fw.Trainer(devices=2, strategy="ddp_gloo", max_epochs=1, **workload.FIT_ARGS)

class SaveMidway(fw.Callback):
    def on_train_epoch_end(self, trainer, module):
        try:  # rank 0 cannot write there: the other rank must hear of it, not wait for it
            trainer.save_checkpoint(f"{out}/not_a_dir.txt/x.ckpt")
        except Exception as err:
            with open(f"{out}/rank{trainer.global_rank}.json", "w") as f:
                json.dump({"error": f"{type(err).__name__}: {err}"}, f)

trainer.callbacks.append(SaveMidway())
trainer.fit(workload.Regressor(), DataLoader(workload.regression_data(16), batch_size=4))
"""


@pytest.mark.timeout(45)
def test_a_failed_checkpoint_write_on_rank_0_is_reported_on_every_rank(tmp_path):
    (tmp_path / "not_a_dir.txt").write_text("a file, so nothing can be written under it")
    check_ok(run_script(write_script(tmp_path, FAILED_WRITE), str(tmp_path), nprocs=2, timeout=30))
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    assert "NotADirectoryError" in r0["error"] or "FileExistsError" in r0["error"]
    assert r1["error"].startswith("CheckpointError: another rank failed while writing the checkpoint")


AFTER_FIT = """
import json, os, sys
import torch
from torch import nn
from torch.utils.data import DataLoader
import framework as fw
import workload

out, mode = sys.argv[1], sys.argv[2]
if mode == "split_own":  # the script makes the process group: it stays up after each fit
    import torch.distributed as dist
    dist.init_process_group("gloo")

class Dropped(workload.Regressor):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Dropout(0.5), nn.Linear(8, 2))

class EveryRank(fw.Callback):
    def on_save_checkpoint(self, trainer, module, checkpoint):  # Lightning calls it on every rank
        open(f"{out}/{mode}_saved_on_rank{trainer.global_rank}", "w").write(str(checkpoint["global_step"]))

def fit(epochs, ckpt_path=None):
    torch.manual_seed(7)
    model = Dropped()
    trainer = fw.Trainer(devices=2, strategy="ddp_gloo", max_epochs=epochs, callbacks=[EveryRank()],
                         **workload.FIT_ARGS)
    torch.manual_seed(100 + trainer.global_rank)  # each rank draws its own dropout masks
    trainer.fit(model, DataLoader(workload.regression_data(32), batch_size=4), ckpt_path=ckpt_path)
    return trainer, model

if mode == "whole":
    trainer, model = fit(2)
else:
    trainer, model = fit(1)
    rng = torch.get_rng_state()
    trainer.validate(model, DataLoader(workload.regression_data(8), batch_size=4), verbose=False)  # draws a seed
    trainer.save_checkpoint(f"{out}/{mode}.ckpt")  # fw's process group is gone by now: still the fit's
    trainer, model = fit(2, f"{out}/{mode}.ckpt")
    torch.save(rng, f"{out}/{mode}_rng_after_fit{trainer.global_rank}.pt")
with open(f"{out}/{mode}{trainer.global_rank}.json", "w") as f:
    json.dump(torch.cat([p.flatten() for p in model.parameters()]).tolist(), f)
if mode == "split_own":
    from framework.strategies.distributed import destroy_process_groups
    destroy_process_groups()
"""


@pytest.mark.timeout(120)
def test_a_checkpoint_saved_after_a_distributed_fit_holds_every_rank_and_resumes_bit_exactly(tmp_path):
    """Its RNG states are every rank's as the fit ended (not rank 0's alone), so the fit resumed
    from it on 2 ranks with dropout is the uninterrupted fit bit for bit; and every rank's
    ``on_save_checkpoint`` ran (Lightning's), though rank 0 alone writes. A ``validate`` between
    the fit and the save changes none of it: the checkpoint is still the fit's, as in Lightning.
    The same where the script made the process group, which stays up after the fit (``split_own``:
    the save gathers the states then; it wrote the states after the validate before)."""
    script = write_script(tmp_path, AFTER_FIT)
    for mode in ("whole", "split", "split_own"):
        check_ok(run_script(script, str(tmp_path), mode, nprocs=2, timeout=60))
    for mode in ("split", "split_own"):
        for rank in range(2):
            assert json.loads((tmp_path / f"{mode}{rank}.json").read_text()) == json.loads((tmp_path / f"whole{rank}.json").read_text())
            assert (tmp_path / f"{mode}_saved_on_rank{rank}").read_text() == "4"
        saved = load_checkpoint(tmp_path / f"{mode}.ckpt")
        assert len(saved["rng"]) == 2
        for rank in range(2):
            after_fit = torch.load(tmp_path / f"{mode}_rng_after_fit{rank}.pt")
            assert torch.equal(saved["rng"][rank]["now"]["torch"], after_fit), (mode, rank)
