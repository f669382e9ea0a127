"""Strategies own their decisions: how their processes start, where collectives run, which
options they refuse. The Trainer asks them and never branches on their names."""

from __future__ import annotations

import pytest
import torch

import framework as fw
from framework.environments import LocalEnvironment, TorchElasticEnvironment
from framework.errors import ConfigError
from framework.strategies import DDPStrategy, MPIStrategy, create_strategy
from framework.strategies.launchers import ElasticLauncher, MPIExecLauncher

TORCHRUN_RANK_0 = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "x"}


def _connected(strategy, devices):
    from framework.accelerators import get_accelerator
    from framework.environments import DistInfo

    strategy.connect(get_accelerator("cpu"), DistInfo(), devices)
    return strategy


@pytest.mark.parametrize(("name", "devices", "expected"), [
    ("single", [0], type(None)),
    ("ddp_gloo", [0], type(None)),          # a world of one: nothing to start
    ("ddp_gloo", [0, 1], ElasticLauncher),  # fw's own launcher
    ("mpi", [0, 1], MPIExecLauncher),        # "needs mpiexec"
])
def test_each_strategy_says_how_its_processes_start(name, devices, expected):
    strategy = _connected(create_strategy(name, "cpu"), devices)
    launcher = strategy.launcher(LocalEnvironment(env={}), num_nodes=1, max_restarts=0, rdzv_endpoint=None)
    assert type(launcher) is expected


def test_under_an_external_launcher_nothing_is_started():
    torchrun = TorchElasticEnvironment(env=TORCHRUN_RANK_0, argv=[])
    for name in ("ddp_gloo", "mpi"):
        strategy = _connected(create_strategy(name, "cpu"), [0, 1])
        assert strategy.launcher(torchrun, num_nodes=1, max_restarts=0, rdzv_endpoint=None) is None


def test_mpi_without_mpiexec_says_what_to_run():
    with pytest.raises(ConfigError, match="mpiexec -n 2 fw fit"):
        MPIExecLauncher(2).launch(print)


def test_mpi_refuses_an_init_method_it_would_ignore():
    with pytest.raises(ConfigError, match=r"init_method.*mpiexec"):
        create_strategy({"name": "mpi", "init_method": "tcp://127.0.0.1:1234"}, "cpu")
    with pytest.raises(ConfigError, match="init_method"):
        fw.Trainer(accelerator="cpu", strategy={"name": "mpi", "init_method": "env://"}, logger=False)


def test_mpi_is_not_a_gloo_strategy():
    strategy = MPIStrategy()
    assert not isinstance(strategy, DDPStrategy) and strategy.backend == "mpi"
    assert strategy.collective_device == torch.device("cpu")


def test_the_collective_device_is_public():
    assert DDPStrategy("gloo").collective_device == torch.device("cpu")
    assert create_strategy("single", "cpu").collective_device == torch.device("cpu")


def test_single_refuses_several_devices_and_one_process_strategies_refuse_a_launched_job():
    with pytest.raises(ConfigError, match="strategy=single uses one device"):
        fw.Trainer(accelerator="cpu", strategy="single", devices=2, logger=False)
    strategy = create_strategy("single", "cpu")
    with pytest.raises(ConfigError, match="each would train alone"):
        strategy.check(1, 1, 1, TorchElasticEnvironment(env=TORCHRUN_RANK_0, argv=[]))
