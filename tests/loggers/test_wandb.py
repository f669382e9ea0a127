"""WandbLogger: real fits in offline mode (no W&B login here), read back from the run's own
``.wandb`` file; the same config and per-step history as Lightning's WandbLogger."""

from __future__ import annotations

import glob
import json
import os
import pickle
import struct
import time

import pytest
from toy import LinearModel, ToyData

import framework as fw
from framework.callbacks import ModelCheckpoint
from framework.errors import ConfigError
from framework.loggers import WandbLogger
from loggers.fits import SETTINGS, FailsAtStep3, LogsLosses, fit_alone, missing_package_error, needs, sides
from loggers.history import assert_same, recorder, sent

#: wandb.init starts wandb's service process (wandb-core); the fixture below ends it after each test
pytestmark = [pytest.mark.procs, needs("wandb", "WandbLogger")]


@pytest.fixture(autouse=True)
def no_login(tmp_path, monkeypatch):
    """No W&B credentials (so the logger goes offline by itself), and wandb's own folders in the
    test's; wandb's service is ended after the test (its variable goes with it)."""
    import wandb

    for key in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_MODE", "WANDB_PROJECT", "WANDB_BASE_URL",
                "WANDB_DIR", "WANDB_SERVICE"):
        monkeypatch.setenv(key, "")
        monkeypatch.delenv(key)  # recorded as absent: what wandb sets there goes again
    for key, folder in (("NETRC", "no.netrc"), ("WANDB_CONFIG_DIR", "config"), ("WANDB_CACHE_DIR", "cache"),
                        ("WANDB_DATA_DIR", "data")):
        monkeypatch.setenv(key, str(tmp_path / "wandb-home" / folder))
    yield
    wandb.teardown()


# -- reading an offline run: the .wandb file is a log of protobuf records (wandb's LevelDB-style
# -- log: a 7-byte header, then 32 KiB blocks of chunks: crc32c, length, type, data) -------------
BLOCK = 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def _records(path: str) -> list:
    from wandb.proto import wandb_internal_pb2

    with open(path, "rb") as f:
        raw = f.read()
    assert raw[:4] == b":W&B" and struct.unpack("<H", raw[4:6])[0] == 0xBEE1, f"not a .wandb file: {raw[:7]!r}"
    records, pending, pos = [], b"", 7
    while pos + 7 <= len(raw):
        left = BLOCK - pos % BLOCK
        if left < 7:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", raw[pos:pos + 7])
        data, pos = raw[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 0 and length == 0:  # zero padding at the end of the file
            break
        assert kind in (FULL, FIRST, MIDDLE, LAST), f"chunk type {kind}"
        pending = data if kind in (FULL, FIRST) else pending + data
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def _key(item) -> str:
    return item.key or "/".join(item.nested_key)


def _finished_records(path: str, timeout: float = 20) -> list:
    """The records of a finished run's file, once wandb's service has written them all: ``finish``
    returns before the service's writer has flushed the file (its exit record comes last)."""
    end = time.monotonic() + timeout
    while True:
        records = _records(path)
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            return records
        assert time.monotonic() < end, f"{path} has no exit record {timeout} s after the run finished"
        time.sleep(0.1)


def _read_run(folder: str, run_id: str) -> dict:
    """The run's config, history rows, artifacts and exit codes, from its offline run file(s)
    (one per ``wandb.init`` of that id, oldest first)."""
    def started(path: str) -> tuple[str, int]:  # offline-run-<time>-<id>, then -1, -2 within the same second
        stamp, _, rest = os.path.basename(os.path.dirname(path))[len("offline-run-"):].partition(f"-{run_id}")
        return stamp, int(rest[1:] or 0)

    files = sorted(glob.glob(os.path.join(folder, "wandb", f"offline-run-*-{run_id}*", f"run-{run_id}.wandb")),
                   key=started)
    assert files, f"no offline run {run_id} under {folder}"
    run = {"config": {}, "history": [], "artifacts": [], "exit_codes": []}
    for path in files:
        for record in _finished_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "config":
                run["config"].update({_key(i): json.loads(i.value_json) for i in record.config.update})
            elif kind == "history":
                run["history"].append({_key(i): json.loads(i.value_json) for i in record.history.item
                                       if not _key(i).startswith("_")})
            elif kind == "artifact":
                run["artifacts"].append((record.artifact.name, list(record.artifact.aliases),
                                         json.loads(record.artifact.metadata)))
            elif kind == "exit":
                run["exit_codes"].append(record.exit.exit_code)
    run["config"].pop("_wandb", None)
    return run


def _by_step(history: list[dict]) -> dict[str, list[tuple[int, float]]]:
    found: dict[str, list[tuple[int, float]]] = {}
    for row in history:
        for key, value in row.items():
            if key != "trainer/global_step":
                found.setdefault(key, []).append((row["trainer/global_step"], value))
    return found


def test_an_offline_fit_holds_the_config_every_step_and_the_checkpoints(tmp_path, capfd):
    logger = WandbLogger(name="first", save_dir=str(tmp_path / "wb"), project="proj", log_model="all")
    checkpoint = ModelCheckpoint(monitor="val/loss", save_top_k=1, save_last=True)
    trainer = fw.Trainer(logger=[logger, recorder()], callbacks=[checkpoint], **SETTINGS)
    trainer.fit(LinearModel(lr=0.05), datamodule=ToyData())
    assert "no W&B login" in capfd.readouterr().err  # offline by itself, and it says so

    run = _read_run(str(tmp_path / "wb"), logger.version)
    assert run["config"] == {"features": 4, "lr": 0.05, "optimizer": "sgd", "scheduler": None}
    history = _by_step(run["history"])  # every call is one history row, at its trainer/global_step
    assert sorted(history) == ["epoch", "train/loss_epoch", "train/loss_step", "val/loss"]
    assert_same(history, sent(trainer))
    assert [s for s, _ in history["train/loss_step"]] == [1, 3, 5, 7]
    assert run["exit_codes"] == [0]

    # where Lightning puts a W&B run's checkpoints: <save_dir>/<project>/<run id>/checkpoints
    assert logger.name == "proj" and logger.save_dir == str(tmp_path / "wb")
    assert trainer.log_dir == logger.log_dir == os.path.join(str(tmp_path / "wb"), "proj", logger.version)
    assert os.path.dirname(checkpoint.best_model_path) == os.path.join(logger.log_dir, "checkpoints")
    # log_model="all": one model artifact version per save, "best" on the best one
    names = {name for name, _, _ in run["artifacts"]}
    assert names == {f"model-{logger.version}"} and len(run["artifacts"]) == 4  # epoch 0, last, epoch 1, last
    best = [meta for _, aliases, meta in run["artifacts"] if "best" in aliases]
    assert best[-1]["original_filename"] == os.path.basename(checkpoint.best_model_path)
    assert best[-1]["score"] == pytest.approx(float(checkpoint.best_model_score))
    assert best[-1]["ModelCheckpoint"]["monitor"] == "val/loss"


def test_a_failed_fit_exits_1_and_a_later_call_resumes_the_same_run(tmp_path):
    logger = WandbLogger(save_dir=str(tmp_path), log_model=True)
    trainer = fw.Trainer(logger=logger, callbacks=[ModelCheckpoint(every_n_train_steps=2)], **SETTINGS)
    with pytest.raises(ZeroDivisionError):
        trainer.fit(FailsAtStep3(), datamodule=ToyData())
    run_id = logger.version
    run = _read_run(str(tmp_path), run_id)
    assert run["exit_codes"] == [1]
    assert run["artifacts"] == []  # log_model=True uploads at the end of a successful fit only, as in Lightning
    logger.log_metrics({"after": 1.0}, step=9)  # a later write: the same run, resumed
    logger.finalize("finished")
    run = _read_run(str(tmp_path), run_id)
    assert run["exit_codes"] == [1, 0] and logger.version == run_id
    assert pickle.loads(pickle.dumps(logger)).version == run_id  # what ddp_spawn hands its workers
    assert {"after": 1.0, "trainer/global_step": 9} in run["history"]
    with pytest.raises(ValueError, match="the status is"):
        logger.finalize("done")


def _module(base):
    class Net(LogsLosses, base):
        def __init__(self, lr: float = 0.05, sizes: dict | None = None):
            super().__init__()
            self.save_hyperparameters()
            self.seeded_net()

    return Net(sizes={"hidden": 3, "act": "relu"})


def test_the_same_config_and_history_as_lightnings_wandb_logger(tmp_path):
    import wandb

    pl = pytest.importorskip("pytorch_lightning")
    from pytorch_lightning.loggers import WandbLogger as LightningWandbLogger

    runs = {}
    for which, Trainer, Logger, Base in sides(pl, WandbLogger, LightningWandbLogger):
        # mode= goes to wandb.init in both: Lightning's offline=True sets WANDB_MODE=dryrun, which wandb 0.31
        # no longer takes for offline (it asks for a login instead)
        logger = Logger(save_dir=str(tmp_path / which), project="cmp", mode="offline")
        fit_alone(Trainer, logger, _module(Base))
        run_id = logger.version
        if which == "pl":
            wandb.finish()  # Lightning leaves the run to wandb's exit hook
        runs[which] = _read_run(str(tmp_path / which), run_id)
    assert runs["fw"]["config"] == runs["pl"]["config"] == {"lr": 0.05, "sizes": {"hidden": 3, "act": "relu"}}
    assert_same(_by_step(runs["fw"]["history"]), _by_step(runs["pl"]["history"]))


def test_arguments_mean_what_lightnings_mean():
    with pytest.raises(ConfigError, match="Lightning refuses this pair"):
        WandbLogger(offline=True, log_model=True)
    with pytest.raises(ConfigError, match="log_model"):
        WandbLogger(log_model="best")
    with pytest.raises(ConfigError, match="save_dir='a', dir='b'"):
        WandbLogger(save_dir="a", dir="b")
    with pytest.raises(ConfigError, match="version='x', id='y'"):
        WandbLogger(version="x", id="y")
    assert WandbLogger(dir="b").save_dir == "b" and WandbLogger(id="y").version == "y"  # the other name
    assert WandbLogger().name == "lightning_logs" and WandbLogger().save_dir == "."


def test_other_ranks_get_a_stand_in_and_write_nothing(tmp_path, monkeypatch):
    import wandb

    monkeypatch.setenv("RANK", "1")
    logger = WandbLogger(save_dir=str(tmp_path / "wb"))
    logger.log_hyperparams({"a": 1})
    logger.log_metrics({"x": 1.0}, step=0)
    logger.experiment.config["k"] = 1  # user code's calls do nothing there
    logger.finalize("success")
    assert logger.version is None and not (tmp_path / "wb").exists() and wandb.run is None


def test_a_missing_wandb_is_one_line_naming_the_install(monkeypatch):
    missing_package_error(monkeypatch, WandbLogger, "wandb")


def test_an_unknown_keyword_is_one_line_naming_it_before_training(tmp_path):
    """fw: a ConfigError naming the argument and the logger, at set-up (no step taken, no run
    started); Lightning's WandbLogger passes it to ``wandb.init``, whose TypeError ends the fit."""
    checkpoint = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"))
    trainer = fw.Trainer(logger=WandbLogger(save_dir=str(tmp_path), entiti="me"), callbacks=[checkpoint], **SETTINGS)
    with pytest.raises(ConfigError) as err:
        trainer.fit(LinearModel(), datamodule=ToyData())
    message = str(err.value)
    assert message.startswith("WandbLogger(entiti=...): neither WandbLogger nor wandb.init takes an argument 'entiti' "
                              "(did you mean 'entity'?); wandb.init takes entity, project, ")
    assert "\n" not in message and trainer.global_step == 0 and not (tmp_path / "wandb").exists()

    pl = pytest.importorskip("pytorch_lightning")
    from pytorch_lightning.loggers import WandbLogger as LightningWandbLogger

    with pytest.raises(TypeError, match="entiti"):
        fit_alone(pl.Trainer, LightningWandbLogger(save_dir=str(tmp_path / "pl"), offline=True, entiti="me"),
                  _module(pl.LightningModule))
