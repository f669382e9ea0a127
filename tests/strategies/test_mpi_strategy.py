"""The ``mpi`` strategy under ``mpiexec -n 2``: equivalence with one process on the 2x batch,
exact evaluation on an odd-sized set, rank-zero I/O, a failing rank ending the job, and
``fw env`` reporting MPI."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT, subprocess_env
from mpi_helpers import mpiexec, needs_mpi
from toy import freezing_script

pytestmark = [needs_mpi, pytest.mark.mpi]

SCRIPT = textwrap.dedent(
    """
    import json, sys, torch
    import framework as fw
    import framework.checkpointing.file as ckpt_module
    from framework.callbacks import ModelCheckpoint
    from framework.loggers import CSVLogger
    from toy import LinearModel, loader, regression_data
    from exact_eval import EvalModel, eval_data

    out = sys.argv[1]
    torch.set_num_threads(1)
    writes = []
    real_save = ckpt_module.atomic_save
    ckpt_module.atomic_save = lambda obj, path: (writes.append(str(path)), real_save(obj, path))[1]

    class SpyLogger(CSVLogger):
        def log_metrics(self, metrics, step):
            writes.append("log_metrics")
            super().log_metrics(metrics, step)

    # 1. equivalence: per-rank batch 4, unshuffled, SGD, 2 epochs
    model = LinearModel(lr=0.05)
    trainer = fw.Trainer(accelerator="cpu", devices=2, strategy="mpi", max_epochs=2, num_sanity_val_steps=0,
                         enable_progress_bar=False, default_root_dir=out, log_every_n_steps=1,
                         logger=SpyLogger(), callbacks=[ModelCheckpoint(save_last=True)])
    trainer.fit(model, loader(regression_data(32), 4))
    rank = trainer.global_rank
    torch.save(model.state_dict(), f"{out}/params{rank}.pt")

    # 2. exact evaluation on 101 samples
    results = fw.Trainer(accelerator="cpu", devices=2, strategy="mpi", logger=False,
                         enable_progress_bar=False).validate(EvalModel(), loader(eval_data(), 8))
    json.dump({"rank": rank, "world": trainer.world_size, "writes": writes, "val": results[0]},
              open(f"{out}/rank{rank}.json", "w"))
    """
)

EXACT_EVAL = textwrap.dedent(
    """
    import torch
    from torch.utils.data import TensorDataset
    from torchmetrics import SumMetric
    from torchmetrics.classification import BinaryAccuracy
    import framework as fw

    def eval_data(n=101):
        g = torch.Generator().manual_seed(3)
        x = torch.randn(n, 4, generator=g)
        return TensorDataset(x, (x[:, 0] > 0.1).float())

    class EvalModel(fw.TrainModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(1)
            self.net = torch.nn.Linear(4, 1)
            self.acc, self.count = BinaryAccuracy(), SumMetric()
        def validation_step(self, batch, batch_idx):
            x, y = batch
            logit = self.net(x).squeeze(1)
            self.acc(logit.sigmoid(), y)
            self.count.update(torch.ones_like(y))
            self.log("val/acc", self.acc)
            self.log("val/count", self.count)
            self.log("val/bce", torch.nn.functional.binary_cross_entropy_with_logits(logit, y), sync_dist=True)
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)
    """
)


def _mpirun(script: Path, *args: str, n: int = 2, timeout: int = 120) -> subprocess.CompletedProcess:
    cmd = [mpiexec(), "-n", str(n), sys.executable, str(script), *args]
    return subprocess.run(cmd, env=subprocess_env(), capture_output=True, text=True, timeout=timeout)


@pytest.mark.timeout(60)
def test_mpi_equivalence_exact_eval_and_rank_zero_io(tmp_path):
    (tmp_path / "exact_eval.py").write_text(EXACT_EVAL)
    script = tmp_path / "run.py"
    script.write_text(f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n" + SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    proc = _mpirun(script, str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "strategy mpi | backend fw_mpi" in proc.stderr  # library messages go to stderr

    # equivalence: both ranks bit-identical, and equal to one process on the 2x batch
    p0, p1 = torch.load(out / "params0.pt"), torch.load(out / "params1.pt")
    sys.path.insert(0, str(tmp_path))
    from exact_eval import EvalModel, eval_data
    from toy import QUIET, LinearModel, loader, regression_data

    import framework as fw

    single = LinearModel(lr=0.05)
    fw.Trainer(max_epochs=2, **QUIET).fit(single, loader(regression_data(32), 8))
    for key, value in single.state_dict().items():
        assert torch.equal(p0[key], p1[key])
        torch.testing.assert_close(p0[key], value, atol=1e-5, rtol=0)
    assert not torch.allclose(p0["net.weight"], LinearModel().state_dict()["net.weight"])

    # exact evaluation: 101 samples, 51 + 50, no padding duplicates
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    expected = fw.Trainer(**QUIET).validate(EvalModel(), loader(eval_data(), 8))[0]
    for r in ranks:
        assert r["world"] == 2
        assert r["val"]["val/count"] == 101.0
        assert r["val"]["val/acc"] == pytest.approx(expected["val/acc"], abs=1e-7)
        assert r["val"]["val/bce"] == pytest.approx(expected["val/bce"], abs=1e-6)

    # rank-zero I/O: rank 0 wrote checkpoints and logs, rank 1 wrote nothing
    assert any(w.endswith(".ckpt") for w in ranks[0]["writes"]) and "log_metrics" in ranks[0]["writes"]
    assert ranks[1]["writes"] == []
    assert len(list((out / "fw_logs").iterdir())) == 1


FAIL = textwrap.dedent(
    """
    import torch, framework as fw
    from toy import LinearModel, loader, regression_data

    class Fails(LinearModel):
        def training_step(self, batch, batch_idx):
            if self.global_rank == 1 and batch_idx == 3:
                raise ValueError("rank 1 failed at batch 3")
            return super().training_step(batch, batch_idx)

    fw.Trainer(accelerator="cpu", devices=2, strategy="mpi", max_epochs=50, logger=False,
               enable_checkpointing=False, enable_progress_bar=False).fit(Fails(), loader(regression_data(64), 4))
    """
)


@pytest.mark.timeout(45)
def test_fw_env_reports_mpi_library_and_ranks(tmp_path):
    proc = subprocess.run([mpiexec(), "-n", "2", sys.executable, "-m", "framework.cli", "env"], cwd=ROOT,
                          env=subprocess_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "MPICH" in proc.stdout or "Open MPI" in proc.stdout
    import re

    for rank in (0, 1):
        assert re.search(rf"COMM_WORLD\s+rank {rank} of 2", proc.stdout), proc.stdout
    assert re.search(r"detected\s+mpi", proc.stdout)


OUTSIDE = textwrap.dedent(
    """
    import torch, framework as fw
    from toy import LinearModel, loader, regression_data

    trainer = fw.Trainer(accelerator="cpu", devices=2, strategy="mpi", max_epochs=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False)
    trainer.fit(LinearModel(), loader(regression_data(16), 4))
    if trainer.global_rank == 1:
        raise RuntimeError("rank 1 failed between fit and validate")
    trainer.validate(LinearModel(), loader(regression_data(16), 4))  # rank 0 would wait here forever
    """
)


@pytest.mark.timeout(45)
@pytest.mark.parametrize(("body", "message"), [
    (FAIL, "ValueError: rank 1 failed at batch 3"),  # inside the loop: the strategy aborts
    (OUTSIDE, "RuntimeError: rank 1 failed between fit and validate"),  # outside: the excepthook does
])
def test_a_failing_rank_ends_the_mpi_job_within_seconds(tmp_path, body, message):
    script = tmp_path / "fail.py"
    script.write_text(body)
    start = time.monotonic()
    proc = _mpirun(script, timeout=60)
    elapsed = time.monotonic() - start
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert message in output and "aborting the MPI job" in output
    assert elapsed < 30, f"the job took {elapsed:.1f} s to end"




@needs_mpi
@pytest.mark.timeout(75)
def test_a_rank_that_stops_answering_ends_the_mpi_job_after_the_timeout(tmp_path):
    """MPI collectives have no timeout: the group's watchdog says what it waits for, then aborts."""
    script = tmp_path / "stopped.py"
    script.write_text(freezing_script({"name": "mpi", "timeout": 6}, pause=2.5))  # rank 1 stops right after a long wait
    start = time.monotonic()
    proc = _mpirun(script, timeout=60)
    elapsed = time.monotonic() - start
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output
    assert "fw: rank 0 of 2 has waited" in output and "in MPI all-reduce (the backward pass's gradient sync) for the other ranks (aborting after 6 s" \
        in output, output
    assert "fw: error: rank 0 of 2 waited" in output and "rank 1 had not arrived" in output \
        and "; aborting the MPI job" in output, output
    assert elapsed < 40, f"the job took {elapsed:.1f} s to end"


STUCK = textwrap.dedent("""
    import threading, time, torch
    import framework as fw
    from toy import LinearModel, regression_data

    class Stuck(LinearModel):  # rank 2 never returns from its training_step
        def training_step(self, batch, batch_idx):
            if self.global_rank == 0 and batch_idx == 1:  # the others wait long once, then go on
                time.sleep(2.5)
            while self.global_rank == 2 and batch_idx == 2:
                pass
            return super().training_step(batch, batch_idx)

    class Blocks(torch.utils.data.Dataset):  # rank 3's loader blocks at its third batch
        def __init__(self):
            self.data, self.taken = regression_data(64), 0
        def __len__(self):
            return len(self.data)
        def __getitem__(self, i):
            self.taken += 1
            if self.taken > 8 and torch.distributed.get_rank() == 3:
                threading.Event().wait()
            return self.data[i]

    trainer = fw.Trainer(accelerator="cpu", devices=4, strategy={"name": "mpi", "timeout": 6}, max_epochs=1,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.fit(Stuck(), torch.utils.data.DataLoader(Blocks(), batch_size=4))
""")


@pytest.mark.timeout(90)
def test_ranks_stuck_in_user_code_or_a_loader_are_named_by_the_ranks_that_waited(tmp_path):
    """4 ranks: rank 2 loops forever in its training_step, rank 3's data loader blocks. Ranks 0
    and 1 wait in the gradient all-reduce; each names ranks 2 and 3 (not each other), then aborts.
    A step before, ranks 1-3 waited 2.5 s for rank 0 and went on: they are not taken for waiting."""
    script = tmp_path / "stuck.py"
    script.write_text(STUCK)
    start = time.monotonic()
    proc = _mpirun(script, n=4, timeout=60)
    elapsed = time.monotonic() - start
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output
    errors = [line for line in output.splitlines() if line.startswith("fw: error: rank")]
    assert errors and all("in MPI all-reduce (the backward pass's gradient sync) for" in line
                          and "ranks 2, 3 had not arrived" in line for line in errors), output
    assert {line.split(" of ")[0] for line in errors} <= {"fw: error: rank 0", "fw: error: rank 1"}, output
    assert elapsed < 50, f"the job took {elapsed:.1f} s to end"


GLOO_UNDER_MPIEXEC = """
import sys, torch
sys.path.insert(0, {distributed!r})
import sharded
out = sys.argv[1]
for tag, strategy in (("ddp_gloo", "ddp_gloo"), ("fsdp", {{"name": "fsdp", "auto_wrap_policy": ["Block"]}})):
    run = sharded.fit(strategy, devices=2, shuffle=True, root=out)
    if run["rank"] == 0:
        torch.save(run, f"{{out}}/{{tag}}.pt")
"""


@pytest.mark.timeout(90)
def test_gloo_strategies_under_mpiexec_take_ranks_and_rendezvous_from_mpi(tmp_path):
    """ddp_gloo and fsdp started by ``mpiexec -n 2`` with no MASTER_ADDR/MASTER_PORT: rank 0's
    store address goes to the other rank over MPI; 20 AdamW steps on shuffled data end where one
    process on the whole batch ends. (fsdp over fw's MPI group itself is refused: see
    test_fsdp_refusals.)"""
    sys.path.insert(0, str(ROOT / "tests" / "distributed"))
    import sharded

    script = tmp_path / "run.py"
    script.write_text(GLOO_UNDER_MPIEXEC.format(distributed=str(ROOT / "tests" / "distributed")))
    proc = _mpirun(script, str(tmp_path), timeout=80)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    single = sharded.fit("single", devices=1, shuffle=True, root=str(tmp_path / "single"))
    for tag in ("ddp_gloo", "fsdp"):
        run = torch.load(tmp_path / f"{tag}.pt")
        assert run["global_step"] == sharded.STEPS
        gap = max(float((run["weights"][k] - v).abs().max()) for k, v in single["weights"].items())
        assert gap < 1e-5, (tag, gap)
    fsdp = torch.load(tmp_path / "fsdp.pt")
    assert fsdp["sharded"] and fsdp["local_numel"] < 0.55 * sum(v.numel() for v in single["weights"].values())  # a half, and padding
