"""The one check every path fw writes or reads goes through: a local path, or a ``file://`` URL
(taken as the local path it names). Any other ``scheme://`` (``s3://``, ``gs://``, ``az://``,
``hdfs://``, ``http://``, ...) is refused in one line naming the key, before anything is
created: fw writes with the local file system only, and ``os.makedirs("s3://bucket/run")``
would make a folder named ``s3:`` on the local disk (lost with a pod) instead of writing to the
bucket. Lightning reaches object storage through fsspec; fw does not yet (docs/troubleshooting.md, "Checkpoints, files and resume").
"""

from __future__ import annotations

import itertools
import os
import re
from urllib.parse import urlsplit
from urllib.request import url2pathname

from framework.errors import ConfigError

#: ``scheme://``: two characters at least, so that a Windows drive (``C:/...``) is a path
_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+)://")


def local_path(path: str | os.PathLike, key: str) -> str:
    """``path`` as a local path (``file:///x`` becomes ``/x``); a URL of any other scheme, or a
    ``file://`` URL naming another host, is a ``ConfigError`` that names ``key``.

    Args:
        path: what the user gave.
        key: how the user gave it (``trainer.default_root_dir``, ``ModelCheckpoint dirpath``, ...).
    """
    text = os.fspath(path)
    if not isinstance(text, str):  # bytes: no URL fw would read
        return os.fsdecode(text)
    found = _URL.match(text)
    if found is None:
        return text
    scheme = found.group(1).lower()
    parts = urlsplit(text)
    if scheme == "file" and parts.netloc in ("", "localhost"):
        return url2pathname(parts.path)
    where = f"a file on host '{parts.netloc}'" if scheme == "file" else f"object storage ({scheme}://)"
    raise ConfigError(f"{key}='{text}': {where} is not supported yet, fw reads and writes local paths only; "
                      "give a local path or a file:// URL (a bucket mounted as a folder is a local path)")


def new_record(folder: str | os.PathLike, stem: str) -> str:
    """Create, empty, the first of ``stem.yaml``, ``stem-1.yaml``, ``stem-2.yaml``, ... that is not
    in ``folder`` (an exclusive create: never over an earlier command's record) and return its path."""
    os.makedirs(folder, exist_ok=True)
    for n in itertools.count():
        path = os.path.join(folder, f"{stem}.yaml" if n == 0 else f"{stem}-{n}.yaml")
        try:
            open(path, "x", encoding="utf-8").close()
        except FileExistsError:
            continue
        return path
    raise AssertionError("unreachable: itertools.count() does not end")
