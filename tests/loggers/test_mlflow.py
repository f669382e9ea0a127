"""MLFlowLogger: real fits, read back with MLflow's own client, from a local store and from a
real ``mlflow server``; the same names and steps as Lightning's MLFlowLogger."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import pytest
import yaml
from toy import LinearModel, ToyData

import framework as fw
from framework.callbacks import ModelCheckpoint
from framework.errors import ConfigError
from framework.loggers import MLFlowLogger
from loggers.fits import SETTINGS, FailsAtStep3, LogsLosses, fit_alone, missing_package_error, needs, sides
from loggers.history import assert_same, distinct, recorder, sent
from loggers.mlflow_server import MlflowServer

#: every test here starts processes: mlflow's run context asks ``git`` for the source's commit (the
#: tags MLflow gives a new run, as under Lightning), and one test starts an ``mlflow server``
pytestmark = [pytest.mark.procs, needs("mlflow", "MLFlowLogger")]


def client_for(uri: str):
    """MLflow's own client for ``uri``. mlflow is imported by the tests, not at collection: every
    worker of the suite collects every file, and importing mlflow takes 2.4 s of CPU."""
    from mlflow.tracking import MlflowClient

    return MlflowClient(uri)


@pytest.fixture(autouse=True)
def _mlflow_env(monkeypatch):
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")  # no usage reports from a test
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "")  # recorded as it was, so that what Lightning's
    monkeypatch.delenv("MLFLOW_TRACKING_URI")  # mlflow.set_tracking_uri sets there goes again


@pytest.fixture
def file_store(monkeypatch):
    """mlflow 3 refuses its file store unless asked for it: the fast local store for most tests."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")


def _fit(logger, module=None, callbacks=(), **kwargs) -> fw.Trainer:
    trainer = fw.Trainer(logger=[logger, recorder()], callbacks=list(callbacks), **{**SETTINGS, **kwargs})
    trainer.fit(module or LinearModel(lr=0.05), datamodule=ToyData())  # 4 batches an epoch
    return trainer


def _mlflow_history(client, run_id) -> dict[str, list[tuple[int, float]]]:
    keys = client.get_run(run_id).data.metrics
    return {key: sorted((m.step, m.value) for m in client.get_metric_history(run_id, key)) for key in keys}


def _artifacts(client, run_id, path=None) -> set[str]:
    found = set()
    for item in client.list_artifacts(run_id, path):
        found |= _artifacts(client, run_id, item.path) if item.is_dir else {item.path}
    return found


def _read_artifact(client, run_id, path, tmp_path) -> bytes:
    """An artifact's bytes, downloaded by MLflow's artifact repository for the run."""
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    repo = get_artifact_repository(client.get_run(run_id).info.artifact_uri, tracking_uri=client.tracking_uri)
    try:
        os.makedirs(tmp_path, exist_ok=True)
        with open(repo.download_artifacts(path, str(tmp_path)), "rb") as f:
            return f.read()
    finally:
        repo.thread_pool.shutdown(wait=True)  # its download threads end here, not at the end of the process


def _default_local_store(store) -> str:
    """The URI MLFlowLogger's default store has in folder ``store`` with the installed mlflow."""
    try:
        from mlflow.environment_variables import MLFLOW_ALLOW_FILE_STORE  # noqa: F401
    except ImportError:  # mlflow 2: the file store, as Lightning's default
        return f"file:{store}"
    return f"sqlite:///{store / 'mlflow.db'}"  # mlflow 3 refuses the file store by default: a database there


def test_a_fit_is_read_back_by_mlflows_client(tmp_path, capfd):
    store = tmp_path / "mlruns"
    logger = MLFlowLogger(experiment_name="exp", run_name="first", tags={"team": "a"}, save_dir=str(store),
                          log_model="all")
    checkpoint = ModelCheckpoint(monitor="val/loss", save_top_k=1, save_last=True)
    trainer = _fit(logger, callbacks=[checkpoint])

    assert logger.tracking_uri == _default_local_store(store)  # the default: a local store, no server
    if logger.tracking_uri.startswith("sqlite:"):
        assert "refuses the file store" in capfd.readouterr().err  # and it says why not the file store
    client = client_for(logger.tracking_uri)
    run = client.get_run(logger.run_id)
    assert run.info.status == "FINISHED" and run.info.experiment_id == logger.experiment_id == logger.name
    assert run.info.artifact_uri.startswith(store.as_uri())  # the artifacts in the same folder
    assert run.data.tags["mlflow.runName"] == "first" and run.data.tags["team"] == "a"
    assert run.data.params == {"features": "4", "lr": "0.05", "optimizer": "sgd", "scheduler": "None"}
    history = _mlflow_history(client, logger.run_id)
    assert set(history) == {"train/loss_step", "train/loss_epoch", "val/loss", "epoch"}
    assert_same(distinct(history), distinct(sent(trainer)))  # every value, at its step
    assert [step for step, _ in history["train/loss_step"]] == [1, 3, 5, 7]

    # where Lightning puts the checkpoints of an MLflow run: <save_dir>/<experiment id>/<run id>/checkpoints
    assert logger.save_dir == str(store) and logger.version == logger.run_id
    assert trainer.log_dir == logger.log_dir == os.path.join(str(store), logger.name, logger.version)
    assert os.path.dirname(checkpoint.best_model_path) == os.path.join(logger.log_dir, "checkpoints")
    # log_model="all": every save was uploaded (epoch 0's too, deleted from disk since), as Lightning lays it out
    assert _artifacts(client, logger.run_id) == {f"{stem}/{name}" for stem in ("epoch=0-step=4", "epoch=1-step=8", "last")
                                                 for name in (f"{stem}.ckpt", "metadata.yaml", "aliases.txt")}
    with open(checkpoint.last_model_path, "rb") as f:
        assert _read_artifact(client, logger.run_id, "last/last.ckpt", tmp_path / "down") == f.read()  # the final one
    best = os.path.basename(checkpoint.best_model_path)[:-len(".ckpt")]
    assert _read_artifact(client, logger.run_id, f"{best}/aliases.txt", tmp_path / "down") == b"['latest', 'best']"
    meta = yaml.safe_load(_read_artifact(client, logger.run_id, f"{best}/metadata.yaml", tmp_path / "down"))
    assert meta["score"] == pytest.approx(float(checkpoint.best_model_score))
    assert meta["Checkpoint"]["monitor"] == "val/loss" and meta["original_filename"] == f"{best}.ckpt"


def test_log_model_true_uploads_the_files_left_at_the_end(tmp_path, file_store):
    store = tmp_path / "mlruns"
    logger = MLFlowLogger(save_dir=str(store), log_model=True)
    checkpoint = ModelCheckpoint(monitor="val/loss", save_top_k=1, save_last=True)
    _fit(logger, callbacks=[checkpoint])
    assert logger.tracking_uri == f"file:{store}"  # the file store where it is allowed, as Lightning's default
    client = client_for(logger.tracking_uri)
    assert client.get_run(logger.run_id).info.status == "FINISHED"
    # at the end: the best and last.ckpt; epoch 0's best was replaced (and deleted) before that
    assert {p.split("/")[0] for p in _artifacts(client, logger.run_id)} == {"epoch=1-step=8", "last"}


def test_a_later_call_logs_into_the_same_run_and_a_failed_fit_ends_its_run_failed(tmp_path, file_store):
    uri = f"file:{tmp_path / 'mlruns'}"
    logger = MLFlowLogger(tracking_uri=uri)
    trainer = _fit(logger)
    trainer.validate(datamodule=ToyData())
    client = client_for(uri)
    assert client.get_run(logger.run_id).info.status == "FINISHED"  # RUNNING again during validate, then ended
    assert len(client.get_metric_history(logger.run_id, "val/loss")) == 3  # two epochs of fit, then validate
    assert logger.save_dir == str(tmp_path / "mlruns")  # the folder of a file: URI, as Lightning reports it
    clone = pickle.loads(pickle.dumps(logger))  # what ddp_spawn hands its workers: no client, the same run
    assert clone._client is None and clone.version == logger.version

    failed = MLFlowLogger(tracking_uri=uri)
    with pytest.raises(ZeroDivisionError):
        _fit(failed, module=FailsAtStep3())
    run = client.get_run(failed.run_id)
    assert run.info.status == "FAILED" and run.info.experiment_id == logger.experiment_id  # the same experiment
    with pytest.raises(ValueError, match="status is one of"):
        failed.finalize("done")
    again = MLFlowLogger(tracking_uri=uri, run_id=failed.run_id)  # attach to a run by id
    again.log_metrics({"x": 1.0}, step=5)
    again.finalize("success")
    assert client.get_run(failed.run_id).info.status == "FINISHED" and client.get_run(failed.run_id).data.metrics["x"] == 1
    with pytest.raises(ConfigError, match="no such run"):
        MLFlowLogger(tracking_uri=uri, run_id="0123456789abcdef").log_metrics({"x": 1.0}, step=0)


def _module(base):
    class Net(LogsLosses, base):
        def __init__(self, lr: float = 0.05, hidden: int = 3):
            super().__init__()
            self.save_hyperparameters()
            self.seeded_net()

    return Net()


def test_the_same_names_and_steps_as_lightnings_mlflow_logger(tmp_path, file_store):
    pl = pytest.importorskip("pytorch_lightning")
    from pytorch_lightning.loggers import MLFlowLogger as LightningMLFlowLogger

    runs = {}
    for which, Trainer, Logger, Base in sides(pl, MLFlowLogger, LightningMLFlowLogger):
        uri = f"file:{tmp_path / which}"
        logger = Logger(experiment_name="cmp", tracking_uri=uri)
        fit_alone(Trainer, logger, _module(Base))
        client = client_for(uri)
        run = client.get_run(logger.run_id)
        runs[which] = (run.info.status, run.data.params, _mlflow_history(client, logger.run_id))
    assert runs["fw"][:2] == runs["pl"][:2] == ("FINISHED", {"lr": "0.05", "hidden": "3"})
    assert_same(runs["fw"][2], runs["pl"][2])


def test_a_recipe_builds_it_by_target_and_checks_its_arguments(tmp_path, file_store):
    from framework.cli.run_recipe import run_recipe
    from framework.config import load_recipe

    recipe_file = tmp_path / "r.yaml"
    recipe_file.write_text(yaml.safe_dump({
        "module": {"_target_": "toy.LinearModel", "lr": 0.05}, "data": {"_target_": "toy.ToyData"},
        "trainer": {"max_epochs": 1, "accelerator": "cpu", "devices": 1, "enable_progress_bar": False},
        "logger": {"_target_": "framework.loggers.MLFlowLogger", "experiment_name": "from-recipe",
                   "save_dir": str(tmp_path / "mlruns"), "log_model": "all"},
        "callbacks": [{"_target_": "framework.callbacks.ModelCheckpoint"}]}))
    recipe, text = load_recipe(recipe_file)
    run_recipe("fit", recipe, text)
    client = client_for(f"file:{tmp_path / 'mlruns'}")
    experiment = client.get_experiment_by_name("from-recipe")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED" and run.data.params["lr"] == "0.05"
    assert "epoch=0-step=4/epoch=0-step=4.ckpt" in _artifacts(client, run.info.run_id)

    with pytest.raises(ConfigError, match=r"logger.log_model: expected"):
        run_recipe("fit", *load_recipe(recipe_file, ["logger.log_model=best"]))
    with pytest.raises(ConfigError, match="did you mean 'experiment_name'"):
        run_recipe("fit", *load_recipe(recipe_file, ["logger.experiment=x"]))


def test_other_ranks_get_a_stand_in_and_write_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    logger = MLFlowLogger(save_dir=str(tmp_path / "mlruns"), log_model="all")
    logger.log_hyperparams({"a": 1})
    logger.log_metrics({"x": 1.0}, step=0)
    logger.experiment.log_param("run", "id", "v")  # user code's calls do nothing there
    logger.finalize("success")
    assert logger.version is None and not (tmp_path / "mlruns").exists()
    with pytest.raises(ConfigError, match="log_model"):
        MLFlowLogger(log_model="best")


def test_the_libraries_are_imported_at_first_use_only():
    """For both loggers (one interpreter start): fw, its loggers, and building them import neither."""
    code = ("import sys, framework, framework.loggers\n"
            "framework.loggers.MLFlowLogger(save_dir='x'), framework.loggers.WandbLogger(save_dir='x')\n"
            "print(sorted({'mlflow', 'wandb'} & set(sys.modules)))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    assert out == "[]\n"


def test_a_missing_mlflow_is_one_line_naming_the_install(monkeypatch):
    assert missing_package_error(monkeypatch, MLFlowLogger, "mlflow").name == "mlflow"


@pytest.mark.timeout(150)
def test_against_a_real_mlflow_server(tmp_path):
    with MlflowServer(tmp_path) as server:
        uri = server.uri
        logger = MLFlowLogger(experiment_name="served", tracking_uri=uri, log_model="all")
        checkpoint = ModelCheckpoint(save_last=True)
        trainer = _fit(logger, callbacks=[checkpoint], default_root_dir=str(tmp_path / "root"))
        client = client_for(uri)
        run = client.get_run(logger.run_id)
        assert run.info.status == "FINISHED" and run.data.params["lr"] == "0.05"
        history, logged = _mlflow_history(client, logger.run_id), sent(trainer)
        assert all(len(history[key]) <= len(rows) for key, rows in logged.items()), history  # nothing sent twice
        assert_same(distinct(history), distinct(logged))
        # a remote store has no local folder (save_dir None, as Lightning): checkpoints under default_root_dir
        assert logger.save_dir is None and logger.log_dir.startswith(str(tmp_path / "root"))
        assert {p.split("/")[0] for p in _artifacts(client, logger.run_id)} == {"epoch=0-step=4", "epoch=1-step=8", "last"}
        with open(checkpoint.last_model_path, "rb") as f:
            assert _read_artifact(client, logger.run_id, "last/last.ckpt", tmp_path / "down") == f.read()
        assert (tmp_path / "art").is_dir()  # the server kept the artifacts, not this process
        # the staged uploads (hard links in hidden folders beside the checkpoints) are gone
        assert not [n for n in os.listdir(os.path.dirname(checkpoint.last_model_path)) if n.startswith(".fw-upload-")]
