"""``replica.py`` with torchft's download of a peer's state delayed by ``FW_FT_SLOW_HEAL`` seconds,
standing in for a large state over a network: ``python slow_heal.py OUT ...`` (replica.py's
arguments). The peer serving the state must still be there when the download starts."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from torchft.checkpointing import http_transport

sys.path.insert(0, str(Path(__file__).parent))
import replica

_recv = http_transport.HTTPTransport.recv_checkpoint


def _slow_recv(self, *args, **kwargs):
    time.sleep(float(os.environ.get("FW_FT_SLOW_HEAL", "0")))
    return _recv(self, *args, **kwargs)


if __name__ == "__main__":
    http_transport.HTTPTransport.recv_checkpoint = _slow_recv
    replica.main()
