"""Real task records and messages for store tests: the store kit's (`synapse.store.kit`), and
a free port for the tests that restart a peer on the same one."""

from __future__ import annotations

from synapse.store.kit import (
    E_ID,
    E_URL,
    R_ID,
    R_URL,
    T0,
    Duo,
    FakeClock,
    dedup_entry,
    message_item,
    outbox_item,
    save,
)


def free_port() -> int:
    """A port free on 127.0.0.1 right now (to start a peer on the same port again later)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


__all__ = [
    "E_ID",
    "E_URL",
    "R_ID",
    "R_URL",
    "T0",
    "Duo",
    "FakeClock",
    "dedup_entry",
    "free_port",
    "message_item",
    "outbox_item",
    "save",
]
