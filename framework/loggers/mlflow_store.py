"""Where an MLFlowLogger's run goes: the store a ``tracking_uri`` names, checked before the first
write, so that a URI MLflow cannot use, or a server that is not there, is one line (the URI and
the fix) instead of MLflow's traceback (after about 4 minutes of retries for a server).

Also the local store's URI (``local_store``) and the folder of a ``file:`` URI.
"""

from __future__ import annotations

import os
import re
import socket
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from framework.errors import ConfigError
from framework.rank_zero import rank_zero_info

#: how long the look at a server waits for a connection and an answer
PROBE_TIMEOUT = 5.0


def is_server(uri: str) -> bool:
    """``http(s)://``: a tracking server, reached over the network."""
    return uri.lower().startswith(("http://", "https://"))


def why_not_answering(uri: str, timeout: float = PROBE_TIMEOUT) -> str | None:
    """``None`` when something answers HTTP at ``uri`` (any answer: a 404 or a 401 too; whether
    it is an MLflow server and lets us in is MLflow's to say); else why not (refused, no such
    host, no answer in ``timeout`` s). Goes through the proxy of ``$http(s)_proxy``, as MLflow."""
    try:
        with urllib.request.urlopen(urllib.request.Request(uri, method="GET"), timeout=timeout):
            return None
    except urllib.error.HTTPError:
        return None  # an HTTP answer: a server is there
    except urllib.error.URLError as err:
        if isinstance(err.reason, ssl.SSLError):
            return None  # it answered TLS: its certificate is MLflow's settings' business
        return _reason(err.reason)
    except (OSError, ValueError) as err:  # a time-out while reading, a malformed URL
        return _reason(err)


def _reason(err: object) -> str:
    if isinstance(err, socket.gaierror):
        return "no such host"
    if isinstance(err, ConnectionRefusedError):
        return "connection refused"
    if isinstance(err, (TimeoutError, socket.timeout)):
        return f"no answer in {PROBE_TIMEOUT:.0f} s"
    return str(err) or type(err).__name__


def check_server(uri: str, who: str = "MLFlowLogger") -> None:
    """Refuse, in one line, a tracking server that does not answer now."""
    why = why_not_answering(uri)
    if why is not None:
        raise ConfigError(f"{who}(tracking_uri={uri!r}): no MLflow server answers there ({why}); start one "
                          f"(mlflow server --host <host> --port <port>) or give the URI of one that runs")


def make_client(uri: str, who: str = "MLFlowLogger"):  # MlflowClient: mlflow is imported here
    """MLflow's client for ``uri``, a URI whose scheme MLflow does not know refused in one line."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    try:
        return MlflowClient(uri)
    except MlflowException as err:
        if "unsupported uri" not in str(err).lower():
            raise
        known = re.search(r"Supported URI schemes are: \[([^\]]*)\]", str(err))
        schemes = (known.group(1).replace("'", "") if known else "http, https, file, sqlite, postgresql, mysql, "
                   "databricks")
        scheme = uri.split(":", 1)[0] if ":" in uri else uri
        raise ConfigError(f"{who}(tracking_uri={uri!r}): MLflow knows no store of scheme {scheme!r}; give one of "
                          f"{schemes} (http://host:port for a server)") from None


def find_or_create_experiment(client: Any, name: str, artifact_location: str | None) -> str:
    """The id of experiment ``name``, created (with ``artifact_location``) if there is none."""
    found = client.get_experiment_by_name(name)
    if found is not None and found.lifecycle_stage == "deleted":
        raise ConfigError(f"MLFlowLogger(experiment_name={name!r}): that experiment is deleted in "
                          f"{client.tracking_uri}; restore it (mlflow experiments restore) or choose another name")
    if found is not None:
        return found.experiment_id
    rank_zero_info(f"MLFlowLogger: creating experiment {name!r} in {client.tracking_uri}")
    return client.create_experiment(name=name, artifact_location=artifact_location)


def send_now(send: Callable[[], object], done: Callable[[], None] | None) -> None:
    """A call to a local store: made here, then ``done``."""
    try:
        send()
    finally:
        if done is not None:
            done()


def local_store(root: str) -> str:
    """The URI of the local store in folder ``root``: the file store where the installed mlflow
    takes it, else a SQLite database in that folder."""
    try:
        from mlflow.environment_variables import MLFLOW_ALLOW_FILE_STORE
    except ImportError:  # an mlflow whose file store needs no opt-in
        return f"file:{root}"
    if MLFLOW_ALLOW_FILE_STORE.get():
        return f"file:{root}"
    import mlflow

    database = os.path.join(os.path.abspath(root), "mlflow.db")
    os.makedirs(os.path.dirname(database), exist_ok=True)
    rank_zero_info(f"MLFlowLogger: mlflow {mlflow.__version__} refuses the file store unless "
                   f"MLFLOW_ALLOW_FILE_STORE=true; logging to the local database sqlite:///{database}")
    return f"sqlite:///{database}"


def file_uri_path(uri: str) -> str | None:
    if not uri.startswith("file:"):
        return None
    from urllib.parse import unquote, urlparse

    return unquote(urlparse(uri).path) if uri.startswith("file://") else uri[len("file:"):]
