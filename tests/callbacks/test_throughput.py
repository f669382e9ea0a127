"""``ThroughputMonitor``'s closing line (``framework/callbacks/throughput.py``) for a module that
counts its FLOPs: tokens/s per device and, where there is none, plainly why there is no MFU."""

from __future__ import annotations

import pytest
from toy import QUIET, LinearModel, loader, regression_data

import framework as fw
from framework.callbacks import ThroughputMonitor


class Counted(LinearModel):
    def flops_per_token(self) -> float:
        return 6.0 * sum(p.numel() for p in self.parameters())


@pytest.mark.parametrize(("precision", "why"), [
    ("32-true", "no MFU: it needs a GPU (this run is on the CPU)"),
    ("bf16-mixed", "no MFU: it needs a GPU (this run is on the CPU)"),
])
def test_the_closing_line_says_plainly_why_there_is_no_mfu(capsys, precision, why):
    trainer = fw.Trainer(**QUIET, max_steps=16, precision=precision, callbacks=[ThroughputMonitor()])
    trainer.fit(Counted(), loader(regression_data(64), batch_size=4))
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("fw: throughput:")]
    assert line.endswith(f"MFLOPs per token; {why}"), line
