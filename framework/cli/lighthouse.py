"""``fw lighthouse``: the Lighthouse where the replica groups of a ``trainer.strategy=ft`` run meet
each step (torchft's, in this process), until Ctrl-C or SIGTERM.

Example::

    fw lighthouse --port 29510 --min-replicas 1
    # prints: fw: Lighthouse at http://HOST:29510 (min_replicas 1): start each replica group with
    #         trainer.strategy.lighthouse=http://HOST:29510
"""

from __future__ import annotations

import argparse
import sys

#: torchft's default port (``framework.strategies.ft.lighthouse.DEFAULT_PORT``; not imported here: the
#: parser of every fw command is built without torch)
DEFAULT_PORT = 29510


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=DEFAULT_PORT,
                        help=f"the port to listen on, every interface (default {DEFAULT_PORT}; 0: any free one)")
    parser.add_argument("--min-replicas", type=int, default=1,
                        help="replica groups a quorum needs (default 1: the survivors of a loss go on alone)")
    parser.add_argument("--heartbeat-timeout-ms", type=int, default=None,
                        help="a replica silent this long is lost (torchft's default 5000)")
    parser.add_argument("--join-timeout-ms", type=int, default=None,
                        help="how long a quorum waits for a replica that is starting (torchft's default 60000)")


def lighthouse(args: argparse.Namespace) -> int:
    """Serve until stopped; 0 when stopped by a signal."""
    from framework.strategies.ft.lighthouse import serve

    def ready(address: str) -> None:
        sys.stderr.write(f"fw: Lighthouse at {address} (min_replicas {args.min_replicas}): start each replica group "
                         f"with trainer.strategy.lighthouse={address}\n")
        sys.stderr.flush()

    serve(args.port, args.min_replicas, args.heartbeat_timeout_ms, args.join_timeout_ms, ready)
    return 0
