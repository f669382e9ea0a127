"""What ``ft`` and ``ft_fsdp`` refuse in the name of the strategy in use, without processes:
``trainer.precision=16-mixed`` (its GradScaler's normal overflow would stop a replica as a
non-finite loss), and training data the replica groups cannot share (the message names
``ft_fsdp`` under ``ft_fsdp``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from framework.errors import ConfigError
from framework.strategies import create_strategy
from framework.strategies.ddp import DDPStrategy
from framework.strategies.fsdp import FSDPStrategy

LIGHTHOUSE = "http://127.0.0.1:29510"  # never asked: nothing here meets the other replicas


def replica_group(name: str):
    return create_strategy({"name": name, "lighthouse": LIGHTHOUSE, "replica_id": 0, "num_replica_groups": 2}, "cpu")


def module_at(precision: str) -> SimpleNamespace:
    return SimpleNamespace(trainer=SimpleNamespace(precision=precision))


@pytest.mark.parametrize(("name", "inside"), [("ft", DDPStrategy), ("ft_fsdp", FSDPStrategy)])
def test_16_mixed_is_refused_in_one_line_and_bf16_mixed_is_set_up(name, inside, monkeypatch):
    """The refusal comes when the module is set up (where fsdp refuses a precision), before the
    group's strategy wraps it, alike on every rank; bf16-mixed and 32-true go on to the group's
    strategy (stood in for: setting it up needs the process group)."""
    set_up = []
    monkeypatch.setattr(inside, "setup_module", lambda self, module: set_up.append(module) or "wrapped")
    strategy = replica_group(name)
    with pytest.raises(ConfigError) as err:
        strategy.setup_module(module_at("16-mixed"))
    assert str(err.value) == (f"trainer.precision=16-mixed cannot be used with trainer.strategy={name}: the gradient "
                              "scaler's normal overflow steps would stop a replica as a non-finite loss; use "
                              "trainer.precision=bf16-mixed (no scaler) or 32-true")
    assert err.value.alike_on_every_rank and set_up == []
    for precision in ("bf16-mixed", "32-true"):
        module = module_at(precision)
        assert strategy.setup_module(module) == "wrapped" and set_up[-1] is module


@pytest.mark.parametrize("name", ["ft", "ft_fsdp"])
def test_the_data_refusals_name_the_strategy_in_use(name):
    from framework.trainer.checkpointing import _refuse_data_replicas_cannot_share

    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 2)), batch_size=4)
    run = SimpleNamespace(loaders={"train": [loader]}, strategy=replica_group(name),
                          settings=SimpleNamespace(use_distributed_sampler=False))
    with pytest.raises(ConfigError, match=rf"^trainer.use_distributed_sampler=false cannot be used with "
                                          rf"trainer.strategy={name}: every replica group"):
        _refuse_data_replicas_cannot_share(run)
    run.settings.use_distributed_sampler = True  # the loader as it is: not in fw's global order
    with pytest.raises(ConfigError, match=rf"^trainer.strategy={name} needs a training loader fw can split"):
        _refuse_data_replicas_cannot_share(run)
