"""A second signal while ``preempted.ckpt`` is being written: SIGTERM (after a SIGTERM, or after
SLURM's early SIGUSR1) waits for the write and the clean exit the first signal asked for; it
used to kill the process (exit -15) halfway through, leaving the temporary file and no
checkpoint of the stop. A second Ctrl-C still stops at once, without the checkpoint and without
leaving its temporary file.

The second signal is sent from outside while the checkpoint's temporary file is open: an object
in the checkpoint (added by a callback's ``on_save_checkpoint`` to the stop's checkpoint only)
holds the pickler until the test has sent it, so the test does not depend on timing."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from distributed.helpers import PYTHON, _kill_tree, clean_env, write_script
from timescale import scaled

from framework.checkpointing.file import load_checkpoint

SCRIPT = """
import collections, os, sys, time
from pathlib import Path
import torch.nn.functional as F
from torch.utils.data import DataLoader
import framework as fw
import workload

out = Path(sys.argv[1])

class HoldsTheWrite:
    # pickled inside torch.save, with preempted.ckpt's temporary file open: says so, then waits
    # until the test has sent its second signal; it loads back as an empty OrderedDict
    def __reduce_ex__(self, protocol):
        (out / "writing").write_text(str(os.getpid()))
        end = time.monotonic() + 30
        while not (out / "second_sent").exists() and time.monotonic() < end:
            time.sleep(0.01)
        return (collections.OrderedDict, ())

class SlowStop(fw.Callback):
    def on_save_checkpoint(self, trainer, module, checkpoint):
        if trainer.state.stop_reason == "preempted":
            checkpoint["held"] = HoldsTheWrite()

class Slow(workload.Regressor):
    def training_step(self, batch, batch_idx):
        time.sleep(0.05)
        if self.global_step == 3:
            (out / "started").write_text(str(os.getpid()))
        return super().training_step(batch, batch_idx)

fw.seed_everything(0)
trainer = fw.Trainer(devices=1, max_epochs=20, default_root_dir=str(out / "root"), callbacks=[SlowStop()],
                     **workload.FIT_ARGS)
trainer.fit(Slow(), DataLoader(workload.regression_data(64), batch_size=4))
"""


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"ended (exit {proc.returncode}) before {path.name}:\n{proc.communicate()[0]}")
        assert time.monotonic() < end, f"no {path.name} within {timeout} s"
        time.sleep(0.02)


@pytest.mark.timeout(45)
@pytest.mark.parametrize(("first", "second"), [(signal.SIGTERM, signal.SIGTERM), (signal.SIGUSR1, signal.SIGTERM),
                                           (signal.SIGINT, signal.SIGINT)], ids=lambda s: s.name)
def test_a_second_signal_during_the_checkpoint_write(tmp_path, first, second):
    script = write_script(tmp_path, SCRIPT)
    root = tmp_path / "root"
    proc = subprocess.Popen([PYTHON, str(script), str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=clean_env(), start_new_session=True)
    try:
        _wait_for(tmp_path / "started", proc)
        os.kill(proc.pid, first)
        _wait_for(tmp_path / "writing", proc)
        assert list(root.glob(".preempted.ckpt.*.tmp")), "the second signal must come while the file is written"
        os.kill(proc.pid, second)
        (tmp_path / "second_sent").write_text("")
        output, _ = proc.communicate(timeout=scaled(60))
    finally:
        if proc.poll() is None:
            _kill_tree(proc.pid)
            proc.communicate()
    assert not list(root.glob(".*.tmp")), output  # no temporary file left, whichever way it ended
    if second == signal.SIGINT:  # a second Ctrl-C: stop now, cleanly
        assert proc.returncode != 0, output
        assert "received SIGINT again: stopping now, without preempted.ckpt" in output, output
        assert not (root / "preempted.ckpt").exists()
        return
    assert proc.returncode == 0, output
    assert f"fw: rank 0 received {second.name} again: the stop is under way" in output, output
    assert f"fw: stopped by {first.name} at step" in output and "Traceback" not in output, output
    step = int(output.split("fw: stopped by")[1].split("at step")[1].split(";")[0])
    checkpoint = load_checkpoint(root / "preempted.ckpt")  # complete: weights_only loading reads it whole
    assert checkpoint["global_step"] == step and checkpoint["loop"]["stop_reason"] == "preempted"
    assert checkpoint["held"] == {} and set(checkpoint["state_dict"]) == {"net.0.weight", "net.0.bias",
                                                                            "net.2.weight", "net.2.bias"}
