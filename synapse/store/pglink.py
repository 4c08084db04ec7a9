"""How the PostgreSQL store's connections notice a dead link, at both ends.

Without these, a network cut is noticed late. The client's kernel gives up on an
unacknowledged write after about fifteen minutes of retransmissions. The server notices a
client that is gone only through TCP keepalive, whose Linux defaults wait two hours before
the first probe. A session the server still believes in keeps its row locks and its
advisory locks (`synapse.store.holding`). So after a cut that outlasted the client's
patience, the process that reconnects met its own dead session: writes refused because
"another process" (its old self) held the store, or the lease rows that old session's
commit had locked skipped by every takeover, for those two hours.

So every connection of the store asks for keepalive probes from both ends, and for a bound
on unacknowledged data (`tcp_user_timeout`). A dead link is then noticed in about fifteen
seconds: the server ends the session (its transaction rolled back, its locks freed) and the
client's next statement fails and reconnects. A process that is alive but paused (SIGSTOP)
keeps its sessions: its kernel answers the probes. Whatever the URL sets itself is kept
(`?keepalives_idle=60`, `?options=-c%20tcp_keepalives_idle%3D60`): these are defaults only.
Over a Unix-domain socket the settings do nothing, and the server ignores them.
"""

from __future__ import annotations

import os

from psycopg.conninfo import conninfo_to_dict

#: libpq's own settings: probes after 5 s of silence, every 2 s, 3 unanswered end it; data
#: unacknowledged for 15 s ends it too.
CLIENT_LINK_CHECKS = {
    "keepalives": "1",
    "keepalives_idle": "5",
    "keepalives_interval": "2",
    "keepalives_count": "3",
    "tcp_user_timeout": "15000",
}
#: The server's, for the session (settings any user may change), given at connection time.
SERVER_LINK_CHECKS = {
    "tcp_keepalives_idle": "5",
    "tcp_keepalives_interval": "2",
    "tcp_keepalives_count": "3",
    "tcp_user_timeout": "15000",
}


def link_checks(url: str) -> dict[str, str]:
    """The connection parameters to add to `url`'s so that both ends notice a dead link
    (see the module docstring): each one the URL does not set itself."""
    given = conninfo_to_dict(url)
    added = {name: value for name, value in CLIENT_LINK_CHECKS.items() if name not in given}
    # Given here, `options` replaces libpq's PGOPTIONS: what that says is kept in it.
    options = str(given.get("options") or os.environ.get("PGOPTIONS") or "")
    server = [
        f"-c {name}={value}"
        for name, value in SERVER_LINK_CHECKS.items()
        if name not in options and name.replace("_", "-") not in options
    ]
    if server:
        added["options"] = " ".join([options, *server]).strip()
    return added
