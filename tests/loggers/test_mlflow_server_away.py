"""MLFlowLogger against a real ``mlflow server`` that is killed in the middle of a fit (sender.py),
or is not there at the start, or a URI of a scheme MLflow does not know (mlflow_store.py); beside
Lightning's MLFlowLogger in the same cases."""

from __future__ import annotations

import http.server
import os
import signal
import subprocess
import sys
import threading
import time
import warnings

import pytest
from toy import LinearModel, ToyData, loader, regression_data

import framework as fw
from framework.callbacks import Callback, ModelCheckpoint
from framework.errors import ConfigError
from framework.loggers import MLFlowLogger
from framework.rank_zero import FwWarning
from loggers.fits import SETTINGS, LogsLosses, needs
from loggers.history import assert_same, distinct, recorder, sent
from loggers.mlflow_server import MlflowServer

pytestmark = [pytest.mark.procs, needs("mlflow", "MLFlowLogger")]


@pytest.fixture(autouse=True)
def _mlflow_env(monkeypatch):
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"):
        monkeypatch.setenv(name, "")  # recorded as it was, so that what Lightning's mlflow.set_tracking_uri
        monkeypatch.delenv(name)  # sets there goes again


@pytest.fixture(scope="module")
def _module_server(tmp_path_factory):
    """One ``mlflow server`` for the module (a start costs about 5 CPU-s and 10 s), reaped at its
    end; each test's run is its own (the tests read their runs by id)."""
    with MlflowServer(tmp_path_factory.mktemp("mlflow_server")) as server:
        yield server


@pytest.fixture
def server(_module_server):
    """The module's server, up: started again (same port and store) where an earlier test took it
    away and left it so."""
    if _module_server.process is None or _module_server.process.poll() is not None:
        _module_server.kill()  # reaps one killed by a child process (nothing if there is none)
        _module_server.start()
    return _module_server


@pytest.fixture
def fast_retries(monkeypatch):
    """MLflow gives up on a server at once (by default it retries for about 4 minutes)."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "0")


def takes_away(base: type, server: MlflowServer, kill_after: int, back_after: int | None = None, away: float = 0.0):
    """A callback (on fw's or Lightning's ``Callback``) that kills the server after global step
    ``kill_after`` and, ``away`` seconds after step ``back_after``, starts it again."""

    class TakesTheServerAway(base):
        killed_at: float | None = None

        def on_train_batch_end(self, trainer, *args, **kwargs):
            if trainer.global_step == kill_after:
                server.kill()
                self.killed_at = time.monotonic()
            if trainer.global_step == back_after:
                time.sleep(away)
                server.start()

    return TakesTheServerAway()


def _fit(logger, root, *callbacks) -> tuple[fw.Trainer, ModelCheckpoint]:
    checkpoint = ModelCheckpoint(dirpath=str(root / "ckpt"), save_top_k=-1, save_last=True)
    trainer = fw.Trainer(logger=[logger, recorder()], callbacks=[checkpoint, *callbacks],
                         default_root_dir=str(root), **SETTINGS)
    trainer.fit(LinearModel(lr=0.05), datamodule=ToyData())  # 8 steps, metrics every 2, a checkpoint each epoch
    return trainer, checkpoint


def _lightning_module(pl):
    class Net(LogsLosses, pl.LightningModule):
        def __init__(self, lr: float = 0.05):
            super().__init__()
            self.save_hyperparameters()
            self.seeded_net()

    return Net()


def _on_server(uri: str, run_id: str) -> tuple[str, dict, set[str]]:
    """The run's status, its metric history, its parameters and its artifacts' top folders, as the
    server has them."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    run = client.get_run(run_id)
    history = {key: sorted((m.step, m.value) for m in client.get_metric_history(run_id, key)) for key in run.data.metrics}
    return run.info.status, history, run.data.params, {item.path for item in client.list_artifacts(run_id)}


def _checkpoints(folder) -> list[str]:
    return sorted(name for name in os.listdir(folder) if name.endswith(".ckpt"))


def _fw_warnings(record) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, FwWarning)]


@pytest.mark.timeout(240)
def test_a_server_that_goes_away_and_comes_back_gets_everything_and_training_never_stops(tmp_path, server, fast_retries):
    """fw: one warning; the fit goes on; what was logged while the server was away is sent when it
    is back (the checkpoint saved meanwhile too), and the run ends FINISHED. Lightning's logger, in
    the same case: the fit ends with MLflow's error at the first write after the kill, and no
    checkpoint after that is written."""
    logger = MLFlowLogger(tracking_uri=server.uri, log_model="all")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        # away from step 2 to 6 (the checkpoint of epoch 0, at step 4, waits), 3 s at least
        trainer, _ = _fit(logger, tmp_path / "fw", takes_away(Callback, server, 2, 6, away=3.0))
    status, history, params, artifacts = _on_server(server.uri, logger.run_id)
    assert status == "FINISHED" and params["lr"] == "0.05"
    assert_same(distinct(history), distinct(sent(trainer)))  # every value, at its step
    assert artifacts == {"epoch=0-step=4", "epoch=1-step=8", "last"}
    assert _checkpoints(tmp_path / "fw" / "ckpt") == ["epoch=0-step=4.ckpt", "epoch=1-step=8.ckpt", "last.ckpt"]
    assert not [name for name in os.listdir(tmp_path / "fw" / "ckpt") if name.startswith(".fw-upload-")]
    said = _fw_warnings(record)
    assert len(said) == 1, said
    assert said[0].startswith(f"MLFlowLogger: {server.uri} does not answer (") and "training goes on" in said[0]

    pl = pytest.importorskip("pytorch_lightning")
    from mlflow.exceptions import MlflowException
    from pytorch_lightning.loggers import MLFlowLogger as LightningMLFlowLogger

    lightning_logger = LightningMLFlowLogger(tracking_uri=server.uri)
    lightning_checkpoint = pl.callbacks.ModelCheckpoint(dirpath=str(tmp_path / "pl" / "ckpt"), save_top_k=-1)
    lightning = pl.Trainer(logger=lightning_logger, callbacks=[lightning_checkpoint,
                           takes_away(pl.Callback, server, 2)], default_root_dir=str(tmp_path / "pl"), **SETTINGS)
    data = regression_data(32)  # 4 batches an epoch, as ToyData's
    handler = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(MlflowException, match="Connection refused"):
            lightning.fit(_lightning_module(pl), loader(data), loader(data))
    finally:
        signal.signal(signal.SIGTERM, handler)  # Lightning's failed fit leaves its handler there
    assert not (tmp_path / "pl" / "ckpt" / "epoch=1-step=8.ckpt").exists()


@pytest.mark.timeout(240)
def test_a_server_that_never_comes_back_costs_the_fit_flush_timeout_and_one_count(tmp_path, server, monkeypatch):
    """A server killed at step 2 for good, while MLflow retries each call for about 14 s (2 + 4 + 8;
    by default about 4 minutes, which the fit does not wait out either): every checkpoint is written,
    the fit ends about ``flush_timeout`` after its last step, and one warning counts what was not
    sent; what the server has and what was counted add up to what was logged."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "3")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "2")
    logger = MLFlowLogger(tracking_uri=server.uri, flush_timeout=3)
    away = takes_away(Callback, server, 2)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        trainer, _ = _fit(logger, tmp_path / "fw", away)
    took = time.monotonic() - away.killed_at
    assert took < 12, f"the fit ended {took:.0f} s after the server went away"
    assert _checkpoints(tmp_path / "fw" / "ckpt") == ["epoch=0-step=4.ckpt", "epoch=1-step=8.ckpt", "last.ckpt"]
    said = _fw_warnings(record)
    assert len(said) == 1 and said[0].startswith(f"MLFlowLogger: not sent to {server.uri}: "), said
    counted = dict(part.split(" ", 1)[::-1] for part in said[0].split(": ", 2)[2].split(", "))
    assert counted.pop("the run's end (FINISHED)") == "1"
    server.start()  # back, to read what it has
    status, history, params, _ = _on_server(server.uri, logger.run_id)
    assert status == "RUNNING"  # its end was never sent
    logged = sum(len(v) for v in sent(trainer).values())
    assert 0 < int(counted.pop("metric values")) == logged - sum(len(v) for v in history.values())
    # the parameters, sent at the start in one call (features, lr, optimizer, scheduler), may have been on their
    # way when the server went: sent (none counted, all 4 on the server), or counted as not sent (all 4), whether
    # or not the server stored them before its answer was lost
    unsent = int(counted.pop("parameters", 0))
    assert (unsent == 0 and len(params) == 4) or unsent == 4, (unsent, params)
    assert not counted
    # the sender's thread, given up in the middle of MLflow's retries, ends when they do
    for thread in threading.enumerate():
        if thread.name == "fw-MLFlowLogger-sender":
            thread.join(timeout=30)
            assert not thread.is_alive()


@pytest.mark.timeout(120)
def test_a_server_not_there_at_the_start_is_one_line_at_once(tmp_path, fast_retries):
    """fw: a ConfigError naming the URL and the fix, at once, before training; Lightning (with fast
    retries: by default about 4 minutes a call) ends with MLflow's traceback-worthy error."""
    from distributed.helpers import free_port

    uri = f"http://127.0.0.1:{free_port()}"
    start = time.monotonic()
    with pytest.raises(ConfigError) as err:
        _fit(MLFlowLogger(tracking_uri=uri), tmp_path)
    assert time.monotonic() - start < 15
    assert str(err.value) == (f"MLFlowLogger(tracking_uri='{uri}'): no MLflow server answers there (connection "
                              "refused); start one (mlflow server --host <host> --port <port>) or give the URI of one "
                              "that runs")
    assert not (tmp_path / "ckpt").exists()  # refused before any step

    pytest.importorskip("pytorch_lightning")
    from mlflow.exceptions import MlflowException
    from pytorch_lightning.loggers import MLFlowLogger as LightningMLFlowLogger

    with pytest.raises(MlflowException) as lightning_err:
        _ = LightningMLFlowLogger(tracking_uri=uri).experiment
    assert "Connection refused" in str(lightning_err.value)


def test_an_unknown_uri_scheme_is_one_line(tmp_path):
    with pytest.raises(ConfigError) as err:
        _fit(MLFlowLogger(tracking_uri="mlfow://127.0.0.1:5000"), tmp_path)
    assert str(err.value).startswith("MLFlowLogger(tracking_uri='mlfow://127.0.0.1:5000'): MLflow knows no store of "
                                     "scheme 'mlfow'; give one of ")
    assert "http" in str(err.value) and "\n" not in str(err.value)

    pytest.importorskip("pytorch_lightning")
    from mlflow.exceptions import MlflowException
    from pytorch_lightning.loggers import MLFlowLogger as LightningMLFlowLogger

    with pytest.raises(MlflowException, match="unsupported URI"):  # Lightning: MLflow's own error
        _ = LightningMLFlowLogger(tracking_uri="mlfow://127.0.0.1:5000").experiment


def _child(code: str, *argv: str, timeout: float = 180) -> subprocess.CompletedProcess:
    from conftest import subprocess_env

    return subprocess.run([sys.executable, "-c", code, *argv], env=subprocess_env(), capture_output=True, text=True,
                          timeout=timeout)


FORKED_FIT = """
import sys, time
import framework as fw
from toy import LinearModel, ToyData
from framework.loggers import MLFlowLogger
if __name__ == "__main__":
    logger = MLFlowLogger(tracking_uri=sys.argv[1])
    logger.log_hyperparams({"note": "before the fit"})  # a notebook cell: the sender's thread starts here
    end = time.monotonic() + 60
    while logger._sender._queue and time.monotonic() < end:  # sent before the fork (no race with the children)
        time.sleep(0.05)
    trainer = fw.Trainer(logger=logger, accelerator="cpu", devices=2, strategy="ddp_notebook", max_epochs=2,
                         log_every_n_steps=1, enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, default_root_dir=sys.argv[2])
    trainer.fit(LinearModel(lr=0.05), datamodule=ToyData())
    print(logger.run_id, trainer.global_step)
"""


@pytest.mark.timeout(300)
def test_a_logger_used_before_a_forked_fit_sends_the_fit(tmp_path, server):
    """ddp_notebook forks the workers after the logger's sender started (a parameter logged in an
    earlier cell): rank 0's child makes its own sender, so the fit's metrics and the run's end reach
    the server. Before, the child queued into the parent's sender, whose thread is not there: the
    run stayed RUNNING with no metric and no warning."""
    done = _child(FORKED_FIT, server.uri, str(tmp_path / "fit"))
    assert done.returncode == 0, done.stderr[-3000:]
    run_id, steps = done.stdout.split()[-2:]
    status, history, params, _ = _on_server(server.uri, run_id)
    assert status == "FINISHED" and params["note"] == "before the fit" and params["lr"] == "0.05"
    assert [step for step, _ in history["train/loss_step"]] == list(range(int(steps))), history
    assert "not sent" not in done.stderr, done.stderr[-3000:]


NO_FINALIZE = """
import sys
from framework.loggers import MLFlowLogger
from framework.strategies.launchers.processes import kill_tree
logger = MLFlowLogger(tracking_uri=sys.argv[1], flush_timeout=2)
for step in range(20):
    logger.log_metrics({"m": float(step)}, step)
print(logger.run_id, flush=True)
if len(sys.argv) > 2:  # the server goes away before the end: what is left is counted
    import time
    end = time.monotonic() + 60
    while logger._sender._queue and time.monotonic() < end:
        time.sleep(0.05)
    kill_tree(int(sys.argv[2]))
    for step in range(20, 25):
        logger.log_metrics({"m": float(step)}, step)
"""


@pytest.mark.timeout(300)
def test_what_is_logged_without_finalize_is_sent_at_exit_or_counted(tmp_path, server, fast_retries):
    """A script that logs and ends without ``finalize``: the sender's daemon thread would die with
    it; at exit what waits is sent (the 20 values are on the server), or, with the server gone,
    counted in one warning after ``flush_timeout``. Before, 0 of 20 arrived and nothing was said."""
    done = _child(NO_FINALIZE, server.uri)
    assert done.returncode == 0, done.stderr[-3000:]
    run_id = done.stdout.split()[-1]
    _, history, _, _ = _on_server(server.uri, run_id)
    assert history["m"] == [(step, float(step)) for step in range(20)]
    assert "not sent" not in done.stderr, done.stderr[-3000:]

    start = time.monotonic()
    done = _child(NO_FINALIZE, server.uri, str(server.process.pid))
    assert done.returncode == 0, done.stderr[-3000:]
    assert time.monotonic() - start < 60
    assert f"MLFlowLogger: not sent to {server.uri}: 5 metric values" in done.stderr, done.stderr[-3000:]


class _Answers503(http.server.BaseHTTPRequestHandler):
    def _answer(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.timeout(240)
def test_a_server_that_answers_only_503_costs_the_end_flush_timeout(tmp_path, server, monkeypatch):
    """The server is replaced by one that answers every call with 503, which MLflow's client
    retries (here for about 21 s a call, 3 + 6 + 12; by default about 4 minutes): ``finalize``
    gives up after ``flush_timeout`` (the call in flight has been sent that long) and counts what
    was not sent. Before, it waited for MLflow's retries: 248 s with flush_timeout=2 by default."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "3")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "3")
    logger = MLFlowLogger(tracking_uri=server.uri, flush_timeout=2)
    logger.log_hyperparams({"a": 1})
    logger.log_metrics({"x": 1.0}, 0)
    end = time.monotonic() + 60
    while logger._sender._queue and time.monotonic() < end:
        time.sleep(0.05)
    server.kill()
    http.server.ThreadingHTTPServer.allow_reuse_address = True
    for _ in range(100):
        try:
            answers_503 = http.server.ThreadingHTTPServer(("127.0.0.1", server.port), _Answers503)
            break
        except OSError:
            time.sleep(0.2)
    threading.Thread(target=answers_503.serve_forever, daemon=True).start()
    try:
        logger.log_metrics({"x": 2.0}, 1)
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            start = time.monotonic()
            logger.finalize("success")
            took = time.monotonic() - start
        for thread in threading.enumerate():  # the thread, given up in MLflow's retries, ends when they do
            if thread.name == "fw-MLFlowLogger-sender":
                thread.join(timeout=60)
    finally:
        answers_503.shutdown()
        answers_503.server_close()
    assert took < 10, f"finalize took {took:.0f} s with flush_timeout=2"
    assert _fw_warnings(record)[-1] == f"MLFlowLogger: not sent to {server.uri}: 1 metric values, 1 the run's end (FINISHED)"
