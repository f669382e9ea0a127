"""detect_environment: the order kubeflow, torchrun, slurm, mpi, local, and the name registry."""

from __future__ import annotations

import pytest

from framework.environments import (
    ENVIRONMENTS,
    LocalEnvironment,
    MPIEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
    detect_environment,
    get_environment,
)
from framework.errors import ConfigError

TORCHRUN = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}
SRUN = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_ID": "0", "SLURM_LOCALID": "0",
        "SLURM_TASKS_PER_NODE": "2", "SLURM_NODELIST": "vm", "SLURM_JOB_ID": "12"}
MPI = {"PMI_RANK": "0", "PMI_SIZE": "2", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2"}
BATCH = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "12"}


@pytest.mark.parametrize(
    ("env", "cls"),
    [
        ({}, LocalEnvironment),
        (TORCHRUN, TorchElasticEnvironment),
        (SRUN, SLURMEnvironment),
        (MPI, MPIEnvironment),
        (BATCH, LocalEnvironment),                     # sbatch shell: not a SLURM task
        ({**SRUN, **TORCHRUN}, TorchElasticEnvironment),  # torchrun inside srun
        ({**SRUN, **MPI}, SLURMEnvironment),           # srun --mpi=pmi2
        ({**MPI, **TORCHRUN}, TorchElasticEnvironment),
    ],
)
def test_precedence(env: dict, cls: type) -> None:
    environment = detect_environment(env, argv=[])
    assert type(environment) is cls
    assert environment.env is env
    assert environment.info().source == cls.name


def test_registry_order_and_names() -> None:
    assert [cls.name for cls in ENVIRONMENTS] == ["ray", "kubeflow", "torchrun", "slurm", "mpi", "local"]


def test_get_environment_by_name() -> None:
    assert isinstance(get_environment("slurm", env=SRUN), SLURMEnvironment)
    with pytest.raises(ConfigError, match=r"did you mean 'slurm'.*known: ray, kubeflow, torchrun"):
        get_environment("slurn")


def test_defaults_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID", "SLURM_PROCID", "PMI_SIZE",
                "OMPI_COMM_WORLD_SIZE", "PMIX_RANK"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    info = detect_environment(argv=[]).info()
    assert (info.source, info.rank, info.world_size) == ("torchrun", 1, 2)


def test_import_is_light() -> None:
    import subprocess
    import sys

    # Compare with the modules that importing the framework package brings in anyway.
    code = ("import sys, framework\n"
            "before = set(sys.modules)\n"
            "import framework.environments\n"
            "new = set(sys.modules) - before\n"
            "print(any(m.split('.')[0] in ('torch', 'mpi4py') for m in new))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=30, check=True)
    assert done.stdout.strip() == "False"
