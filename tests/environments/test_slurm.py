"""SLURMEnvironment, the sbatch trap and the tasks-per-node check."""

from __future__ import annotations

import shutil

import pytest

from framework.environments import DistInfo, SLURMEnvironment
from framework.environments.slurm import (
    check_slurm_batch_trap,
    check_tasks_per_node,
    master_port_from_job_id,
    parse_tasks_per_node,
)
from framework.errors import ConfigError, DistributedSetupError

# What `srun -N1 -n2` sets in task 1 (as seen on the test cluster of shared/slurm).
SRUN_TASK_1 = {
    "SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURM_NTASKS": "2", "SLURM_NNODES": "1",
    "SLURM_NODEID": "0", "SLURM_JOB_ID": "4321", "SLURM_STEP_ID": "0",
    "SLURM_NODELIST": "vm", "SLURM_JOB_NODELIST": "vm", "SLURM_STEP_NODELIST": "vm",
    "SLURM_TASKS_PER_NODE": "2", "SLURM_CPUS_ON_NODE": "2",
}

# The batch shell of `sbatch -n2`: no SLURM_STEP_* variables.
BATCH_SHELL = {
    "SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_NNODES": "1", "SLURM_NODEID": "0",
    "SLURM_JOB_ID": "4321", "SLURM_NODELIST": "vm", "SLURM_TASKS_PER_NODE": "2",
}


@pytest.fixture(autouse=True)
def _no_scontrol(monkeypatch: pytest.MonkeyPatch) -> None:
    """Expand node lists with the pure parser so results do not depend on the machine."""
    monkeypatch.setattr(shutil, "which", lambda name: None)


def test_detect_only_inside_a_job_step() -> None:
    assert SLURMEnvironment.detect(SRUN_TASK_1)
    assert SLURMEnvironment.detect({**BATCH_SHELL, "SLURM_STEPID": "0"})
    assert not SLURMEnvironment.detect(BATCH_SHELL)
    assert not SLURMEnvironment.detect({"SLURM_JOB_ID": "1", "SLURM_STEP_ID": "0"})  # salloc
    assert not SLURMEnvironment.detect({})


def test_srun_one_node_two_tasks() -> None:
    environment = SLURMEnvironment(env=SRUN_TASK_1, argv=[])
    assert environment.launched_externally
    assert environment.info() == DistInfo(
        rank=1, local_rank=1, world_size=2, local_world_size=2, node_rank=0, num_nodes=1,
        master_addr="vm", master_port=15000 + 4321, source="slurm",
    )


def test_heterogeneous_tasks_per_node() -> None:
    # 7 tasks on 4 nodes laid out 2,2,2,1; this is the last task, alone on node 3.
    env = {
        "SLURM_PROCID": "6", "SLURM_LOCALID": "0", "SLURM_NTASKS": "7", "SLURM_NNODES": "4",
        "SLURM_NODEID": "3", "SLURM_STEP_ID": "0", "SLURM_JOB_ID": "1234567",
        "SLURM_STEP_NODELIST": "gpu[07-08,10],gpu12", "SLURM_NODELIST": "other[1-9]",
        "SLURM_TASKS_PER_NODE": "2(x3),1",
    }
    info = SLURMEnvironment(env=env, argv=[]).info()
    assert (info.rank, info.world_size, info.local_world_size) == (6, 7, 1)
    assert (info.node_rank, info.num_nodes) == (3, 4)
    assert info.master_addr == "gpu07"  # first host of the step's fully expanded list
    assert info.master_port == 15000 + 4567


def test_step_variables_win_over_job_variables() -> None:
    env = {**SRUN_TASK_1, "SLURM_NTASKS": "8", "SLURM_STEP_NUM_TASKS": "2",
           "SLURM_TASKS_PER_NODE": "8", "SLURM_STEP_TASKS_PER_NODE": "2"}
    info = SLURMEnvironment(env=env, argv=[]).info()
    assert (info.world_size, info.local_world_size) == (2, 2)


def test_master_variables_override() -> None:
    env = {**SRUN_TASK_1, "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29400"}
    info = SLURMEnvironment(env=env, argv=[]).info()
    assert (info.master_addr, info.master_port) == ("10.0.0.1", 29400)


def test_no_job_id_no_port() -> None:
    env = {k: v for k, v in SRUN_TASK_1.items() if k != "SLURM_JOB_ID"}
    assert SLURMEnvironment(env=env, argv=[]).info().master_port is None


@pytest.mark.parametrize(("job_id", "port"), [("7", 15007), ("123456789", 21789),
                                              ("10000", 15000), ("99999", 24999)])
def test_master_port_from_job_id(job_id: str, port: int) -> None:
    assert master_port_from_job_id(job_id) == port
    assert 10000 <= port <= 60000


@pytest.mark.parametrize(
    ("spec", "counts"),
    [("2", [2]), ("2(x3),1", [2, 2, 2, 1]), ("4,2(x2)", [4, 2, 2]), ("1(x1)", [1])],
)
def test_parse_tasks_per_node(spec: str, counts: list[int]) -> None:
    assert parse_tasks_per_node(spec) == counts


def test_bad_tasks_per_node() -> None:
    with pytest.raises(DistributedSetupError, match="SLURM_TASKS_PER_NODE"):
        parse_tasks_per_node("2(3)")


def test_node_id_beyond_tasks_per_node() -> None:
    env = {**SRUN_TASK_1, "SLURM_NODEID": "1", "SLURM_NNODES": "2"}
    with pytest.raises(DistributedSetupError, match="SLURM_NODEID=1"):
        SLURMEnvironment(env=env, argv=[]).info()


def test_batch_trap_raises_for_multi_process_run() -> None:
    with pytest.raises(DistributedSetupError, match="inside an sbatch script but outside srun"):
        check_slurm_batch_trap(BATCH_SHELL, requested_world_size=2)


@pytest.mark.parametrize(
    ("env", "world"),
    [
        (BATCH_SHELL, 1),                                      # a single process is fine
        (SRUN_TASK_1, 2),                                      # inside srun
        ({**BATCH_SHELL, "SLURM_NTASKS": "1"}, 2),             # fw may start its workers
        ({}, 4),                                               # not SLURM at all
        ({**BATCH_SHELL, "RANK": "0", "WORLD_SIZE": "2"}, 2),  # torchrun in the batch script
        ({**BATCH_SHELL, "PMI_SIZE": "2"}, 2),                 # mpirun in the batch script
    ],
)
def test_batch_trap_quiet(env: dict, world: int) -> None:
    check_slurm_batch_trap(env, requested_world_size=world)


def test_tasks_per_node_check() -> None:
    info = SLURMEnvironment(env=SRUN_TASK_1, argv=[]).info()
    check_tasks_per_node(info, devices=2)
    with pytest.raises(ConfigError, match=r"HINT: set trainer.devices=2 to match --ntasks-per-node"):
        check_tasks_per_node(info, devices=4)


def test_the_environment_checks_itself_against_devices_and_nodes() -> None:
    slurm = SLURMEnvironment(env=SRUN_TASK_1, argv=[])
    slurm.check(devices=2, num_nodes=1)
    with pytest.raises(ConfigError, match="--ntasks-per-node"):
        slurm.check(devices=4, num_nodes=1)  # SLURM's own hint comes first
    with pytest.raises(ConfigError, match=r"HINT: set trainer.num_nodes=1"):
        slurm.check(devices=2, num_nodes=2)


def test_the_local_environment_refuses_to_start_workers_from_a_batch_shell() -> None:
    from framework.environments import LocalEnvironment

    local = LocalEnvironment(env=BATCH_SHELL, argv=[])
    local.check(devices=1, num_nodes=1)
    with pytest.raises(DistributedSetupError, match="outside srun"):
        local.check(devices=2, num_nodes=1)
