"""Where fw writes and reads its outputs: a local path, or an fsspec URL (``s3://bucket/run``,
``gs://``, ``memory://``, ...). Every path the user gives goes through one of two checks:

- ``storage_path`` for the outputs that may live in object storage (``default_root_dir``,
  ``ModelCheckpoint(dirpath=...)``, ``ckpt_path``, ``save_checkpoint``, the CSV and TensorBoard
  loggers' ``save_dir``, ``PredictionWriter(output_dir=...)``): a URL stays a URL and is read
  and written through fsspec (``filesystem``), never through ``os``: ``os.makedirs("s3://b/run")``
  would make a local folder named ``s3:`` (lost with a pod) instead of writing to the bucket;
- ``local_path`` for the rest (profiler output, ``hparams_file``): a URL is refused in one line.

``file:///x`` is the local path ``/x`` for both. Credentials and endpoints come from the
environment (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL``, ...: what
the fsspec back end reads) and from ``storage_options`` given for a URL (``use_storage_options``:
the Trainer's, a ModelCheckpoint's or a logger's). The small file operations below take a local
path or a URL alike, so the callers read the same for both. A write to a URL appears whole or
not at all: an object store makes an object visible only once its upload completed (a single
PUT, or a multipart upload's completion); other back ends write to a temporary name and move it.
"""

from __future__ import annotations

import contextlib
import glob as local_glob
import itertools
import logging
import os
import posixpath
import queue
import re
import threading
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit
from urllib.request import url2pathname

from framework.errors import CheckpointError, ConfigError

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem  # type: ignore[import-untyped]  # fsspec ships no types

#: ``scheme://``: two characters at least, so that a Windows drive (``C:/...``) is a path
_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+)://")
#: a chained fsspec URL (``simplecache::s3://bucket/run``), refused: not a local path either
_CHAINED = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+::")
#: object stores, whose URLs name a bucket (or container) first, which must exist
_BUCKETED = {"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oss", "r2"}
#: back ends whose objects appear whole when their upload completes (no temporary name needed)
_OBJECT_STORES = _BUCKETED | {"memory"}
#: the extra that installs each back end, for the line a missing one gives
_EXTRAS = {"s3": "s3", "s3a": "s3"}
#: storage_options given for a URL prefix (``use_storage_options``)
_OPTIONS: dict[str, dict[str, Any]] = {}
#: the buckets whose checkpoint uploads run in the background (``upload_in_background``)
_BACKGROUND: set[str] = set()
_log = logging.getLogger(__name__)


def _scheme(text: str) -> str | None:
    found = _URL.match(text)
    return found.group(1).lower() if found else None


def is_url(path: str | os.PathLike | None) -> bool:
    """Is ``path`` a URL fw reads and writes through fsspec (any ``scheme://`` but a local ``file://``)?"""
    if path is None:
        return False
    text = os.fspath(path)
    if not isinstance(text, str):
        return False
    scheme = _scheme(text)
    return scheme is not None and not (scheme == "file" and urlsplit(text).netloc in ("", "localhost"))


def local_path(path: str | os.PathLike, key: str) -> str:
    """``path`` as a local path (``file:///x`` becomes ``/x``); a URL of any other scheme, or a
    ``file://`` URL naming another host, is a ``ConfigError`` that names ``key``.

    Args:
        path: what the user gave.
        key: how the user gave it (``trainer.profiler dirpath``, ...).
    """
    text = os.fspath(path)
    if not isinstance(text, str):  # bytes: no URL fw would read
        return os.fsdecode(text)
    if _CHAINED.match(text):
        raise ConfigError(f"{key}='{text}': chained fsspec URLs (simplecache::s3://...) are not supported; give the "
                          "URL itself (s3://bucket/run)")
    scheme = _scheme(text)
    if scheme is None:
        return text
    parts = urlsplit(text)
    if scheme == "file" and parts.netloc in ("", "localhost"):
        return url2pathname(parts.path)
    where = f"a file on host '{parts.netloc}'" if scheme == "file" else f"object storage ({scheme}://)"
    raise ConfigError(f"{key}='{text}': {where} is not supported here, fw reads and writes local paths only for "
                      f"{key}; give a local path or a file:// URL (a bucket mounted as a folder is a local path)")


def storage_path(path: str | os.PathLike, key: str) -> str:
    """``path`` as fw keeps an output location: a local path as ``local_path`` gives it, or a
    URL (``s3://bucket/run``) as it is, without a trailing ``/``. A ``file://`` URL of another
    host is refused (``local_path``), and so is a scheme whose fsspec back end is missing (one
    line naming ``key`` and the package), before anything is written."""
    text = os.fspath(path)
    if isinstance(text, str) and is_url(text):
        if _scheme(text) == "file":
            return local_path(text, key)
        try:
            filesystem(text, settle=False)  # no request is made: the back end is imported and set up
        except ConfigError as err:
            raise ConfigError(f"{key}={err}") from None
        return text.rstrip("/") if not text.endswith("://") else text
    return local_path(text, key)


def use_storage_options(url: str | os.PathLike | None, options: dict[str, Any] | None) -> None:
    """Read and write ``url``'s bucket (everything under ``scheme://bucket``) with fsspec's
    ``options`` (``key``, ``secret``, ``endpoint_url``, ``client_kwargs``, ...); a local path or no
    options: nothing. The options are the process's from then on, as fsspec keeps its file systems."""
    if options is None or url is None or not is_url(url):
        return
    if not isinstance(options, dict):
        raise ConfigError(f"storage_options for '{os.fspath(url)}' must be a mapping (key: value), "
                          f"got {type(options).__name__}")
    parts = urlsplit(os.fspath(url))
    _OPTIONS[f"{parts.scheme}://{parts.netloc}"] = dict(options)


def _bucket(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def upload_in_background(url: str | os.PathLike | None, on: bool = True) -> None:
    """Upload the checkpoints written to ``url``'s bucket in a background thread (``later``):
    the training step waits for the checkpoint's serialisation only. A local path: nothing."""
    if url is not None and is_url(url):
        (_BACKGROUND.add if on else _BACKGROUND.discard)(_bucket(os.fspath(url)))


class _Uploads:
    """One thread that runs the background writes in the order they were given, so that a
    checkpoint's index is uploaded after the checkpoint and a pruned file after its upload.
    Every other operation on a URL first waits for it (``settle``): this process reads back
    what it wrote. A checkpoint's upload waits for the one before (``add(..., one_at_a_time=True)``,
    as Lightning's ``AsyncCheckpointIO`` keeps one save in flight): at most one serialised
    checkpoint waits in memory. After a write failed nothing more is written (the order holds),
    and the failure is raised in the training thread by the next checkpoint's ``add`` (the next
    save, which every rank learns the outcome of) or ``settle`` (the end of a fit), whichever
    comes first; an index or a removal (rank 0's alone) never raises it. At exit the thread finishes what it was
    given (it is not a daemon), and it ends once idle for half a second."""

    def __init__(self) -> None:
        self._tasks: queue.Queue[tuple[str, Callable[[], None]]] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._failed: tuple[str, BaseException] | None = None  # the failure the training thread has not raised yet
        self._broken = False  # a write failed: what waits behind it is skipped until the queue is empty
        self._lock = threading.Lock()
        self._pending: dict[str, bool] = {}  # URL: whether it will exist once the queue ran (a write, a removal)

    def pending(self, url: str) -> bool | None:
        """Whether ``url`` will exist once what waits has run, if something waiting writes or removes it."""
        with self._lock:
            return self._pending.get(url)

    def add(self, url: str, task: Callable[[], None], exists: bool | None = None, one_at_a_time: bool = False) -> None:
        if one_at_a_time:  # the previous checkpoint's upload (and its index, its prunings) first
            self._tasks.join()
            self._raise_failed()  # a save after a failed upload fails (where every rank learns of it: a save)
        with self._lock:  # the entry and its task together: the thread clears entries only with an empty queue
            if exists is not None:
                self._pending[url] = exists
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="fw-uploads", daemon=False)
                self._thread.start()
            self._tasks.put((url, task))

    def _run(self) -> None:
        while True:
            try:
                url, task = self._tasks.get(timeout=0.5)
            except queue.Empty:
                with self._lock:  # idle: the thread ends (the next add starts another)
                    if self._tasks.unfinished_tasks == 0:
                        self._thread = None
                        return
                continue
            try:
                if not self._broken:  # after a failure nothing given before it is known is written: the order holds
                    task()
            except BaseException as err:  # raised in the training thread by the next add() or settle()
                self._failed, self._broken = (url, err), True
                _log.error("fw: uploading '%s' failed: %s", url, err)
            finally:
                with self._lock:
                    if self._tasks.unfinished_tasks == 1:  # the last one: nothing written is pending
                        self._pending.clear()
                        self._broken = False
                self._tasks.task_done()

    def drain(self) -> None:
        """Wait for every background write; a failure stays for the next ``add`` or ``settle``."""
        self._tasks.join()

    def settle(self) -> None:
        """Wait for every background write; raise the first that failed (once)."""
        self._tasks.join()
        self._raise_failed()

    def _raise_failed(self) -> None:
        """Raise the write that failed, once (the thread sets ``_failed``; this thread clears it)."""
        failed, self._failed = self._failed, None
        if failed is not None:
            url, err = failed
            raise CheckpointError(f"the background upload of '{url}' failed ({type(err).__name__}: {_first_line(err)}); "
                                  "the checkpoints uploaded before it are intact. Check the storage and its credentials")


_UPLOADS = _Uploads()


def _forget_uploads_after_fork() -> None:
    """A forked child has no upload thread (threads do not survive a fork): it starts empty."""
    global _UPLOADS
    _UPLOADS = _Uploads()


os.register_at_fork(after_in_child=_forget_uploads_after_fork)


def later(url: str, task: Callable[[], None], exists: bool | None = None, one_at_a_time: bool = False) -> None:
    """Run ``task`` (writes to ``url``) in the background where ``url``'s bucket uploads there
    (``upload_in_background``), else now. ``exists``: whether ``url`` is there after the task
    (what ``exists(url)`` answers meanwhile). ``one_at_a_time``: the task holds a serialised
    checkpoint; the background writes given before finish first (one waits in memory at most).

    Raises:
        CheckpointError: with ``one_at_a_time``, a background write given before failed (nothing
            is queued then).
    """
    if is_url(url) and _bucket(url) in _BACKGROUND:
        _UPLOADS.add(url, task, exists, one_at_a_time)
    else:
        task()


def forget_storage_settings() -> None:
    """Drop every bucket's ``storage_options`` and background uploads (a new Trainer gives its
    own: nothing of an earlier Trainer's applies to it), after the uploads still waiting, which
    were given with them (a failed one is raised at the next write or ``wait_for_uploads``)."""
    _UPLOADS.drain()
    _OPTIONS.clear()
    _BACKGROUND.clear()


def wait_for_uploads() -> None:
    """Wait for the background uploads of this process.

    Raises:
        CheckpointError: one of them failed (one line naming its URL); raised once.
    """
    _UPLOADS.settle()


def options_for(url: str) -> dict[str, Any]:
    """The ``storage_options`` given for ``url``'s bucket (``use_storage_options``), or none."""
    prefix = max((p for p in _OPTIONS if url == p or url.startswith(p + "/")), key=len, default=None)
    return dict(_OPTIONS[prefix]) if prefix is not None else {}


def filesystem(url: str, settle: bool = True) -> tuple[AbstractFileSystem, str]:
    """The fsspec file system of ``url`` and the path on it, with the ``storage_options`` given
    for the longest prefix of ``url`` that has any; ``settle``: after the background uploads of
    this process (what it wrote is there).

    Raises:
        ConfigError: the back end of the scheme is not installed (one line naming the extra).
    """
    options = options_for(url)
    if settle and threading.current_thread().name != "fw-uploads":  # what this process wrote is there first
        _UPLOADS.settle()
    try:
        from fsspec.core import url_to_fs  # type: ignore[import-untyped]

        return url_to_fs(url, **options)
    except ImportError as err:
        scheme = _scheme(url) or "?"
        extra = _EXTRAS.get(scheme)
        fix = f'pip install "fw[{extra}]"' if extra else _first_line(err)
        raise ConfigError(f"'{url}': reading and writing {scheme}:// needs a package that is missing; {fix}") from None
    except ValueError as err:  # an unknown protocol
        raise ConfigError(f"'{url}': {err}; give a local path or a URL fsspec knows (s3://, gs://, memory://, ...)") from None
    except Exception as err:  # a back end that cannot start here (hdfs:// without a JVM, ...)
        raise ConfigError(f"'{url}': cannot open {_scheme(url)}:// here ({type(err).__name__}: {_first_line(err)})") from None


def check_storage(url: str, key: str) -> None:
    """Make sure ``url`` can be written before anything is: in an object store its bucket exists
    and the credentials are accepted (a probe lists the bucket's top; nothing is created); in
    another file system (``memory://``, ``sftp://``, ...) folders are made as files are written.

    Raises:
        ConfigError: one line naming ``key``, the URL and the fix.
    """
    try:
        fs, path = filesystem(url)
    except ConfigError as err:
        raise ConfigError(f"{key}={err}") from None
    bucket = path.strip("/").split("/", 1)[0]
    if not _protocols(fs) & _BUCKETED:
        return
    try:
        fs.ls(bucket, detail=False)
    except FileNotFoundError:
        raise ConfigError(f"{key}='{url}': the bucket '{bucket}' does not exist at "
                          f"{_endpoint(fs)}; create it, or fix the URL (or AWS_ENDPOINT_URL / "
                          "storage_options endpoint_url)") from None
    except PermissionError as err:
        raise ConfigError(f"{key}='{url}': the storage refused the credentials ({_first_line(err)}); set "
                          "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or storage_options key/secret) to ones "
                          f"allowed to write to '{bucket}'") from None
    except Exception as err:  # no credentials at all, an endpoint that does not answer, ...
        raise ConfigError(f"{key}='{url}': cannot reach the storage ({type(err).__name__}: {_first_line(err)}); "
                          "check the credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY or storage_options) "
                          "and the endpoint (AWS_ENDPOINT_URL or storage_options endpoint_url)") from None


def _protocols(fs: AbstractFileSystem) -> set[str]:
    return {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)


def _endpoint(fs: AbstractFileSystem) -> str:
    client = getattr(fs, "client_kwargs", None) or {}
    return str(client.get("endpoint_url") or getattr(fs, "endpoint_url", None)
               or os.environ.get("AWS_ENDPOINT_URL") or f"the {sorted(_protocols(fs))[0]} service")


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return (text.splitlines()[0] if text else type(err).__name__)[:200]


# -- small file operations on a local path or a URL alike ----------------------------------------
def join(base: str, *parts: str) -> str:
    """``base/part/...``: ``/`` for a URL, the OS's separator for a local path."""
    return posixpath.join(base, *parts) if is_url(base) else os.path.join(base, *parts)


def dirname(path: str) -> str:
    return posixpath.dirname(path) if is_url(path) else os.path.dirname(path)


def basename(path: str) -> str:
    return posixpath.basename(path) if is_url(path) else os.path.basename(path)


def real(path: str) -> str:
    """``os.path.realpath`` of a local path (a ``~`` stays a folder named ``~``, as before URLs
    were read: ``ModelCheckpoint`` expands its ``dirpath`` itself, as Lightning's); a URL as it is."""
    return path if is_url(path) else os.path.realpath(path)


def _url_of(fs: AbstractFileSystem, like: str, path: str) -> str:
    """``path`` on ``fs`` in the form of the user's URL ``like`` (a pattern): its folder before
    any wildcard, as the user spelt it (``memory:///x``, ``abfs://container@account/x``,
    ``hdfs://host:port/x``), followed by the rest of ``path``; fsspec's own form otherwise."""
    cut = min((i for i, char in enumerate(like) if char in "*?["), default=len(like))
    base_url = like[:cut] if cut == len(like) else like[:cut].rsplit("/", 1)[0]
    if "://" not in base_url:  # a wildcard in the URL's first part
        return str(fs.unstrip_protocol(path))
    base_path = fs._strip_protocol(base_url).rstrip("/")
    if path == base_path or path.startswith(base_path + "/"):
        return base_url.rstrip("/") + path[len(base_path):]
    return str(fs.unstrip_protocol(path))


def exists(path: str) -> bool:
    if not is_url(path):
        return os.path.exists(path)
    pending = _UPLOADS.pending(path)
    if pending is not None:  # a background upload or removal of it waits: its outcome, without waiting
        return pending
    fs, p = filesystem(path, settle=False)
    return bool(fs.exists(p))


def isdir(path: str) -> bool:
    if not is_url(path):
        return os.path.isdir(path)
    fs, p = filesystem(path)
    return bool(fs.isdir(p))


def isfile(path: str) -> bool:
    if not is_url(path):
        return os.path.isfile(path)
    fs, p = filesystem(path)
    return bool(fs.isfile(p))


def listdir(path: str) -> list[str]:
    """The names in the folder ``path`` (empty where there is none)."""
    if not is_url(path):
        return os.listdir(path) if os.path.isdir(path) else []
    fs, p = filesystem(path)
    try:
        return [posixpath.basename(entry.rstrip("/")) for entry in fs.ls(p, detail=False, refresh=True)]
    except FileNotFoundError:
        return []


def glob(pattern: str, recursive: bool = False) -> list[str]:
    """The paths matching ``pattern`` (``**`` with ``recursive``), as URLs for a URL."""
    if not is_url(pattern):
        return local_glob.glob(pattern, recursive=recursive)
    fs, p = filesystem(pattern)
    fs.invalidate_cache()  # another process (an earlier run, another rank) may have written since
    return [_url_of(fs, pattern, found) for found in fs.glob(p)]


def modified(path: str) -> float:
    """When ``path`` was last written, in seconds since the epoch (an object's upload time)."""
    if not is_url(path):
        return os.path.getmtime(path)
    fs, p = filesystem(path)
    info = fs.info(p)
    when = info.get("LastModified") or info.get("mtime") or info.get("created") or info.get("last_modified")
    if when is None:
        return 0.0
    return when.timestamp() if hasattr(when, "timestamp") else float(when)


def stamp(path: str) -> tuple[int, str]:
    """What tells one version of the file ``path`` from another: its size and its modification
    time (a local file) or its ETag / upload time (an object)."""
    if not is_url(path):
        stat = os.stat(path)
        return stat.st_size, str(stat.st_mtime_ns)
    fs, p = filesystem(path)
    info = fs.info(p)
    tag = info.get("ETag") or info.get("LastModified") or info.get("mtime") or info.get("created")
    return int(info.get("size") or 0), str(tag)


def read_bytes(path: str) -> bytes:
    if not is_url(path):
        with open(path, "rb") as f:
            return f.read()
    fs, p = filesystem(path)
    return bytes(fs.cat_file(p))


def write_bytes(url: str, data: bytes) -> None:
    """Write ``data`` to the URL ``url`` so that it appears whole or not at all: one upload on an
    object store, a temporary name moved into place elsewhere."""
    fs, p = filesystem(url)
    if _protocols(fs) & _OBJECT_STORES:
        fs.pipe_file(p, data)
        return
    tmp = posixpath.join(posixpath.dirname(p), f".{posixpath.basename(p)}.{uuid.uuid4().hex}.tmp")
    fs.pipe_file(tmp, data)
    try:
        fs.mv(tmp, p)
    finally:
        if fs.exists(tmp):
            fs.rm(tmp)


def write_text(path: str, text: str) -> None:
    """Write ``text`` to ``path`` (a local file as ``open(path, "w")`` does)."""
    if not is_url(path):
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return
    write_bytes(path, text.encode("utf-8"))


def remove(path: str) -> None:
    """Remove the file or folder ``path``; one already gone is no error (a URL: after the
    background uploads given before, ``later``)."""
    if not is_url(path):
        import shutil

        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.remove(path)
        return
    def remove_url() -> None:
        fs, p = filesystem(path)
        with contextlib.suppress(FileNotFoundError):
            fs.rm(p, recursive=True)

    later(path, remove_url, exists=False)


def upload_folder(local: str, url: str) -> None:
    """Copy the files under the local folder ``local`` to the same names under ``url``."""
    fs, p = filesystem(url, settle=False)
    for folder, _, names in os.walk(local):
        for name in names:
            source = os.path.join(folder, name)
            relative = os.path.relpath(source, local).replace(os.sep, "/")
            fs.put_file(source, posixpath.join(p, relative))


def new_record(folder: str | os.PathLike, stem: str) -> str:
    """Create, empty, the first of ``stem.yaml``, ``stem-1.yaml``, ``stem-2.yaml``, ... that is not
    in ``folder`` (an exclusive create: never over an earlier command's record) and return its path.
    In a bucket, where no create is exclusive, the first name not there yet."""
    folder = os.fspath(folder)
    if is_url(folder):
        for n in itertools.count():
            path = join(folder, f"{stem}.yaml" if n == 0 else f"{stem}-{n}.yaml")
            if not exists(path):
                write_bytes(path, b"")
                return path
    os.makedirs(folder, exist_ok=True)
    for n in itertools.count():
        path = os.path.join(folder, f"{stem}.yaml" if n == 0 else f"{stem}-{n}.yaml")
        try:
            open(path, "x", encoding="utf-8").close()
        except FileExistsError:
            continue
        return path
    raise AssertionError("unreachable: itertools.count() does not end")
