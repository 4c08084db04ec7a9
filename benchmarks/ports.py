"""Ports for the servers the benchmarks and the tests start on 127.0.0.1.

A port found by binding port 0 comes from the ephemeral range, the same range every outgoing
connection of the machine draws its local port from: between choosing it and a server binding
it, a connection (of this process, a worker, a parallel test) may take it, and the server
fails with EADDRINUSE. So the ports handed out here lie *below* the ephemeral range, where
only a listening server can take one; each is checked free by a bind (without SO_REUSEADDR, so
a port still in TIME_WAIT is passed over), drawn from the system's randomness (forked workers
share the `random` module's state, not this), and never handed out twice by one process.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

HOST = "127.0.0.1"

_handed_out: set[int] = set()
_randomness = random.SystemRandom()


def _range() -> tuple[int, int]:
    """The ports below the ephemeral range, from 10,000 up."""
    try:
        first_ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        first_ephemeral = 32768
    return (10_000, max(first_ephemeral - 1, 20_000))


def free_port() -> int:
    """A port nobody listens on at 127.0.0.1 right now, for a server started later."""
    low, high = _range()
    for _ in range(1_000):
        port = _randomness.randint(low, high)
        if port in _handed_out:
            continue
        with socket.socket() as sock:
            try:
                sock.bind((HOST, port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free port on {HOST} between {low} and {high}")


def free_ports(count: int) -> list[int]:
    """`count` distinct free ports."""
    return [free_port() for _ in range(count)]
