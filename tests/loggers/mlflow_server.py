"""A real ``mlflow server`` on 127.0.0.1 for the MLflow logger tests: started and stopped with
bounded waits, killed (with its workers) on the way out, and started again on the same port and
store, so that a test can take the server away in the middle of a fit and bring it back."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from distributed.helpers import free_port

from framework.strategies.launchers.processes import kill_tree


class MlflowServer:
    """``with MlflowServer(folder) as server:`` a server at ``server.uri``, its store and artifacts
    in ``folder``; ``kill()`` takes it away, ``start()`` brings it back."""

    def __init__(self, folder: Path, start_timeout: float = 100.0) -> None:
        self.folder, self.start_timeout = Path(folder), start_timeout
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> MlflowServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()

    def start(self) -> None:
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_DISABLE_TELEMETRY": "true"}
        log = self.folder / "server.log"
        with open(log, "a") as err:
            self.process = subprocess.Popen(
                [os.path.join(os.path.dirname(sys.executable), "mlflow"), "server", "--host", "127.0.0.1",
                 "--port", str(self.port), "--workers", "1", "--backend-store-uri",
                 f"sqlite:///{self.folder / 'server.db'}", "--artifacts-destination", str(self.folder / "art")],
                cwd=self.folder, env=env, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        end = time.monotonic() + self.start_timeout
        while True:
            assert self.process.poll() is None, f"mlflow server ended: {log.read_text()[-2000:]}"
            assert time.monotonic() < end, f"mlflow server not up after {self.start_timeout} s: {log.read_text()[-2000:]}"
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.3)

    def kill(self) -> None:
        """SIGKILL the server and its workers, and reap it (a server that is already gone: nothing)."""
        if self.process is not None:
            kill_tree(self.process.pid)
            self.process.wait(timeout=30)
            self.process = None
