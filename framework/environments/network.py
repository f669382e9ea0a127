"""This host's network interfaces and their IPv4 addresses (for ``socket_ifname``, the
multi-node launcher and ``fw env``)."""

from __future__ import annotations

import socket
import struct
import subprocess

_SIOCGIFADDR = 0x8915  # Linux ioctl: the IPv4 address of an interface


def interface_addresses() -> dict[str, str | None]:
    """Return ``{interface: IPv4 address or None}``, via ioctl, else ``ip -o -4 addr``."""
    try:
        import fcntl

        names = [name for _, name in socket.if_nameindex()]
    except (ImportError, OSError, AttributeError):
        return _ip_command_addresses()
    found: dict[str, str | None] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for name in names:
            request = struct.pack("256s", name.encode()[:15])
            try:
                reply = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, request)
                found[name] = socket.inet_ntoa(reply[20:24])
            except OSError:
                found[name] = None
    return found


def _ip_command_addresses() -> dict[str, str | None]:
    """Parse ``ip -o -4 addr``: ``2: eth0    inet 10.0.0.5/24 brd ...``."""
    try:
        done = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True,
                              timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return {}
    found: dict[str, str | None] = {}
    for line in done.stdout.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[2] == "inet":
            found[fields[1]] = fields[3].split("/")[0]
    return found
