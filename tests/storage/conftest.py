"""Fixtures of the object-storage tests: one moto S3 server per pytest process (``s3_server``,
started by the first test that needs it, killed at the end of the session), its credentials and
endpoint in this process's environment while a test module runs (``s3``: what fw and the
processes the tests start read), and a fresh bucket per test."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import pytest

from .s3_server import S3Server

_BUCKETS = itertools.count()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory) -> Iterator[S3Server]:
    """moto's server on 127.0.0.1, shared by the modules of this pytest process (a start costs
    seconds of CPU: moto's import and the user it makes)."""
    pytest.importorskip("s3fs", reason="the s3:// tests need s3fs (pip install 'fw[s3]')")
    pytest.importorskip("moto.server", reason="the s3:// tests need moto's server (pip install 'moto[server]')")
    server = S3Server(tmp_path_factory.mktemp("moto") / "server.log")
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def s3(s3_server: S3Server) -> Iterator[S3Server]:
    """The server, with its credentials and endpoint in ``os.environ`` while the module runs."""
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()  # fsspec keeps file systems by their arguments, not the environment's
    before = {name: os.environ.get(name) for name in s3_server.env}
    os.environ.update(s3_server.env)
    try:
        yield s3_server
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture
def bucket(s3: S3Server) -> str:
    """A new, empty bucket's name."""
    name = f"fw-test-{os.getpid()}-{next(_BUCKETS)}"
    s3.filesystem().mkdir(name)
    return name
