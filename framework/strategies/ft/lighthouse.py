"""The Lighthouse, where the replica groups of a fault-tolerant run meet each step for a quorum
(torchft's ``LighthouseServer``): found from the strategy's ``lighthouse`` option or
``TORCHFT_LIGHTHOUSE``, checked before a replica waits on it, and served by ``fw lighthouse``.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from typing import Any
from urllib.parse import urlparse

from framework.errors import ConfigError, DistributedSetupError, install_command

#: the port torchft's ``torchft_lighthouse`` binds by default
DEFAULT_PORT = 29510


def import_torchft() -> Any:
    """The ``torchft`` package, or one line naming the extra that installs it."""
    # torchft's Rust half logs every quorum and commit at INFO on stderr unless told otherwise when it
    # is first imported (fw says what matters); the variable is put back at once
    quiet = "RUST_LOG" not in os.environ and "torchft" not in sys.modules
    if quiet:
        os.environ["RUST_LOG"] = "warn"
    try:
        import torchft  # type: ignore[import-untyped]
    except ImportError:
        raise ConfigError("trainer.strategy=ft needs torchft, which is not installed: "
                          f"{install_command('ft')} (or pip install torchft)") from None
    finally:
        if quiet:
            os.environ.pop("RUST_LOG", None)
    return torchft


def lighthouse_address(given: str | None) -> str:
    """``http://HOST:PORT`` of the Lighthouse: ``given`` (``HOST:PORT`` is enough), else
    ``TORCHFT_LIGHTHOUSE``."""
    address = given or os.environ.get("TORCHFT_LIGHTHOUSE")
    if not address:
        raise ConfigError("trainer.strategy.lighthouse: no Lighthouse named; give its address "
                          f"(e.g. lighthouse=http://127.0.0.1:{DEFAULT_PORT}, the one `fw lighthouse` prints) "
                          "or set TORCHFT_LIGHTHOUSE")
    if "://" not in address:
        address = f"http://{address}"
    url = urlparse(address)
    if not url.hostname or url.port is None:
        raise ConfigError(f"trainer.strategy.lighthouse '{given}' must look like http://HOST:PORT")
    return address


def check_reachable(address: str, wait_s: float) -> None:
    """Refuse to start when nothing listens at ``address`` within ``wait_s`` seconds (a replica
    would otherwise wait for its quorum until torchft's own timeouts).

    Raises:
        DistributedSetupError: nothing answered.
    """
    url = urlparse(address)
    host, port = url.hostname, int(url.port or DEFAULT_PORT)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=min(2.0, max(wait_s, 0.1))):
                return
        except OSError as err:
            if time.monotonic() >= deadline:
                raise DistributedSetupError(
                    f"no Lighthouse answers at {address} ({err.strerror or err}): start one first "
                    f"(`fw lighthouse --min-replicas 1 --port {port}`) or name the right one with "
                    "trainer.strategy.lighthouse=http://HOST:PORT") from None
        time.sleep(0.2)


def serve(port: int, min_replicas: int, heartbeat_timeout_ms: int | None = None,
          join_timeout_ms: int | None = None, ready: Any = None) -> None:
    """Run a Lighthouse on ``port`` (every interface) until SIGINT or SIGTERM; ``ready(address)``
    is called once it listens."""
    import signal
    import threading

    torchft = import_torchft()
    from torchft.coordination import LighthouseServer  # type: ignore[import-untyped]

    del torchft
    try:
        server = LighthouseServer(bind=f"[::]:{port}", min_replicas=min_replicas,
                                  heartbeat_timeout_ms=heartbeat_timeout_ms, join_timeout_ms=join_timeout_ms)
    except Exception as err:  # the port taken: torchft's RuntimeError with the OS's words
        raise DistributedSetupError(f"the Lighthouse cannot listen on port {port}: {str(err).splitlines()[0]}; "
                                    "pick another with --port") from None
    stop = threading.Event()
    before = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        address = server.address()
        if ready is not None:
            ready(address)
        while not stop.wait(0.5):
            pass
    finally:
        server.shutdown()
        for sig, handler in before.items():
            signal.signal(sig, handler)
