"""Real task records and messages for store tests: the store kit's (`synapse.store.kit`), and
a free port for the tests that restart a peer on the same one."""

from __future__ import annotations

from benchmarks.ports import free_port as free_port  # re-exported
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
