"""MPIEnvironment from mocked variables, and for real under ``mpiexec -n 2``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from framework.environments import DistInfo, MPIEnvironment
from framework.environments.mpi import MPIWorld
from framework.errors import DistributedSetupError
from tests.distributed.helpers import clean_env

OPEN_MPI = {
    "OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
    "OMPI_COMM_WORLD_NODE_RANK": "1",
}
HYDRA = {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}
MPIEXEC = Path(sys.executable).parent / "mpiexec"
REPO = Path(__file__).resolve().parents[2]


class FakeMPIEnvironment(MPIEnvironment):
    """Answers the mpi4py query with a fixed world instead of initializing MPI."""

    world: MPIWorld | None = None

    def _query_mpi(self) -> MPIWorld | None:
        return self.world


def test_detect() -> None:
    assert MPIEnvironment.detect(OPEN_MPI)
    assert MPIEnvironment.detect(HYDRA)
    assert MPIEnvironment.detect({"PMIX_RANK": "0"})
    assert not MPIEnvironment.detect({"PMI_RANK": "0"})  # PMI_RANK alone: not enough
    assert not MPIEnvironment.detect({})


def test_open_mpi() -> None:
    environment = MPIEnvironment(env=OPEN_MPI, argv=[])
    assert environment.launched_externally
    assert environment.info() == DistInfo(
        rank=5, local_rank=1, world_size=8, local_world_size=4, node_rank=1, num_nodes=2,
        source="mpi",
    )


def test_hydra_with_master_variables() -> None:
    env = {**HYDRA, "MASTER_ADDR": "head", "MASTER_PORT": "29500"}
    assert MPIEnvironment(env=env, argv=[]).info() == DistInfo(
        rank=1, local_rank=1, world_size=2, local_world_size=2, node_rank=0, num_nodes=1,
        master_addr="head", master_port=29500, source="mpi",
    )


def test_node_rank_from_rank_and_local_size() -> None:
    env = {"PMI_RANK": "6", "PMI_SIZE": "8", "MPI_LOCALRANKID": "2", "MPI_LOCALNRANKS": "4"}
    info = MPIEnvironment(env=env, argv=[]).info()
    assert (info.node_rank, info.num_nodes) == (1, 2)


def test_missing_local_variables_ask_mpi4py() -> None:
    environment = FakeMPIEnvironment(env={"PMI_RANK": "3", "PMI_SIZE": "4"}, argv=[])
    environment.world = MPIWorld(rank=3, size=4, local_rank=1, local_size=2)
    info = environment.info()
    assert (info.local_rank, info.local_world_size, info.node_rank) == (1, 2, 1)


def test_pmix_only_asks_mpi4py_for_size() -> None:
    environment = FakeMPIEnvironment(env={"PMIX_RANK": "1"}, argv=[])
    environment.world = MPIWorld(rank=1, size=2, local_rank=1, local_size=2)
    assert environment.info().world_size == 2


def test_without_mpi4py_assumes_one_node() -> None:
    info = FakeMPIEnvironment(env={"PMI_RANK": "1", "PMI_SIZE": "2"}, argv=[]).info()
    assert (info.local_rank, info.local_world_size, info.num_nodes) == (1, 2, 1)


def test_without_mpi4py_and_without_size() -> None:
    with pytest.raises(DistributedSetupError, match="mpi4py"):
        FakeMPIEnvironment(env={"PMIX_RANK": "0"}, argv=[]).info()


def _run_mpiexec(script: str, out_dir: Path) -> list[DistInfo]:
    """Run ``script`` on 2 ranks; each writes its DistInfo as JSON to ``out_dir/<rank>.json``.

    Files, not stdout: mpiexec forwards the ranks' output unsynchronized, so lines can mix.
    """
    # a plain mpiexec job even inside torchrun or srun
    env = clean_env(PYTHONPATH=str(REPO), FW_TEST_OUT=str(out_dir))
    done = subprocess.run(
        [str(MPIEXEC), "-n", "2", sys.executable, "-c", script],
        capture_output=True, text=True, timeout=60, env=env, cwd=REPO, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    files = sorted(out_dir.glob("*.json"))
    return sorted((DistInfo(**json.loads(f.read_text())) for f in files), key=lambda i: i.rank)


_WRITE_INFO = (
    "import dataclasses, json, os\n"
    "from framework.environments import detect_environment\n"
    "info = detect_environment().info()\n"
    "path = os.path.join(os.environ['FW_TEST_OUT'], f'{info.rank}.json')\n"
    "open(path, 'w').write(json.dumps(dataclasses.asdict(info)))\n"
)


@pytest.mark.mpi
@pytest.mark.skipif(not MPIEXEC.exists(), reason=f"no mpiexec next to {sys.executable}")
def test_real_mpiexec_two_ranks(tmp_path: Path) -> None:
    infos = _run_mpiexec(_WRITE_INFO, tmp_path)
    assert [(i.rank, i.local_rank, i.world_size, i.source) for i in infos] == [
        (0, 0, 2, "mpi"), (1, 1, 2, "mpi"),
    ]


@pytest.mark.mpi
@pytest.mark.skipif(not MPIEXEC.exists(), reason=f"no mpiexec next to {sys.executable}")
def test_real_mpiexec_local_ranks_from_mpi4py(tmp_path: Path) -> None:
    pytest.importorskip("mpi4py", reason="the local-rank fallback needs mpi4py")
    hide = "import os\nfor k in ('MPI_LOCALRANKID', 'MPI_LOCALNRANKS'): os.environ.pop(k, None)\n"
    infos = _run_mpiexec(hide + _WRITE_INFO, tmp_path)
    assert [(i.rank, i.local_rank, i.local_world_size) for i in infos] == [(0, 0, 2), (1, 1, 2)]
