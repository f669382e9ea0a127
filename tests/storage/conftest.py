"""Fixtures of the object-storage tests: one moto S3 server per test module (``s3``), its
credentials and endpoint in this process's environment while the module runs (``monkeypatch``
of the module: what fw and the processes the tests start read), and a fresh bucket per test."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import pytest

from .s3_server import S3Server

_BUCKETS = itertools.count()


@pytest.fixture(scope="module")
def s3(tmp_path_factory) -> Iterator[S3Server]:
    pytest.importorskip("s3fs", reason="the s3:// tests need s3fs (pip install 'fw[s3]')")
    pytest.importorskip("moto.server", reason="the s3:// tests need moto's server (pip install 'moto[server]')")
    import s3fs

    server = S3Server(tmp_path_factory.mktemp("moto") / "server.log")
    s3fs.S3FileSystem.clear_instance_cache()  # fsspec keeps file systems by their arguments, not the environment's
    try:
        server.start()
        before = {name: os.environ.get(name) for name in server.env}
        os.environ.update(server.env)
        try:
            yield server
        finally:
            for name, value in before.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
    finally:
        server.stop()
        s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture
def bucket(s3: S3Server) -> str:
    """A new, empty bucket's name."""
    name = f"fw-test-{os.getpid()}-{next(_BUCKETS)}"
    s3.filesystem().mkdir(name)
    return name
