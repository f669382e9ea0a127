"""``rendezvous.elastic_job_id``: the id a job's checkpoints carry, kept in the agent's store."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from framework.rank_zero import FwWarning
from framework.strategies.launchers import rendezvous
from framework.strategies.launchers.rendezvous import elastic_job_id


def test_the_job_id_is_the_run_id_and_one_nonce_per_agent_store(monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    ids = []
    for _ in range(2):  # two jobs, each with its own agent store
        agent = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
        monkeypatch.setenv("MASTER_PORT", str(agent.port))
        first = elastic_job_id()
        assert elastic_job_id() == first  # the next fit of this process: asked once a process
        rendezvous._JOB_IDS.clear()  # a restarted worker is a new process: it asks the store again
        again = elastic_job_id()
        assert first == again and first.startswith("none:")
        ids.append(first)
        del agent
    assert ids[0] != ids[1]


def test_without_the_agent_or_its_store(monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert elastic_job_id() is None
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-7")
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    monkeypatch.setenv("RANK", "0")
    with pytest.warns(FwWarning, match="run id 'job-7' alone"):
        assert elastic_job_id() == "job-7"
