"""Bad distributed input fails at once with an error that says what to change (in-process:
each case fails before any process group exists)."""

from __future__ import annotations

import socket

import pytest
from torch.utils.data import DataLoader

import framework as fw

from . import workload

LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                 "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_NTASKS")


@pytest.fixture(autouse=True)
def plain_shell(monkeypatch):
    for name in LAUNCHER_VARS:
        monkeypatch.delenv(name, raising=False)


def _fit(strategy) -> None:
    trainer = fw.Trainer(devices=1, strategy=strategy, max_epochs=1, **workload.FIT_ARGS)
    trainer.fit(workload.Regressor(), train_dataloaders=DataLoader(workload.regression_data(8), batch_size=4))


@pytest.mark.timeout(30)
def test_port_in_use():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(fw.DistributedSetupError, match=rf"port in use at tcp://127.0.0.1:{port}.*pick a free port"):
            _fit({"name": "ddp_gloo", "init_method": f"tcp://127.0.0.1:{port}", "timeout": 5})


def test_file_init_in_missing_directory(tmp_path):
    missing = tmp_path / "no" / "such"
    with pytest.raises(fw.ConfigError, match=rf"directory {missing} does not exist"):
        fw.Trainer(devices=1, strategy={"name": "ddp_gloo", "init_method": f"file://{missing}/x"}, **workload.FIT_ARGS)


def test_unknown_socket_ifname_lists_interfaces():
    known = [name for _, name in socket.if_nameindex()]
    with pytest.raises(fw.ConfigError, match="interface 'nosuch0' does not exist") as err:
        _fit({"name": "ddp_gloo", "socket_ifname": "nosuch0"})
    assert "interfaces here: " + ", ".join(known) in str(err.value)


def test_ddp_nccl_without_cuda():
    with pytest.raises(fw.ConfigError, match=r"ddp_nccl needs CUDA.*ddp_gloo"):
        fw.Trainer(accelerator="cpu", devices=2, strategy="ddp_nccl")
