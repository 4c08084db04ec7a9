"""How the PostgreSQL store's connections notice a dead link, at both ends.

Without these, a network cut is noticed late. The client's kernel gives up on an
unacknowledged write after about fifteen minutes of retransmissions. The server notices a
client that is gone only through TCP keepalive, whose Linux defaults wait two hours before
the first probe. A session the server still believes in keeps its row locks and its
advisory locks (`synapse.store.holding`). So after a cut that outlasted the client's
patience, the process that reconnected met its own dead session: writes refused because
"another process" (its old self) held the store, or the lease rows that old session's
commit had locked skipped by every takeover, for those two hours.

So every connection of the store asks for keepalive probes from both ends, and for a bound
on unacknowledged data (`tcp_user_timeout`). A dead link is then noticed in about fifteen
seconds: the server ends the session (its transaction rolled back, its locks freed) and the
client's next statement fails and reconnects. A process that is alive but paused (SIGSTOP)
keeps its sessions: its kernel answers the probes.

The client's side is libpq's connection parameters. The server's side is set for the
session once connected (`set_config`, one round trip per connection, which lives long),
not with the `options` startup parameter, which connection poolers such as PgBouncer
refuse. Whatever the URL sets itself is kept: a libpq parameter it names
(`?keepalives_idle=60`), a server setting its `options` (or `PGOPTIONS`) names. Over a
Unix-domain socket the settings do nothing, and the server ignores them.
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
#: The server's, for the session (settings any user may change), and the server version
#: each needs.
SERVER_LINK_CHECKS = {
    "tcp_keepalives_idle": ("5", 0),
    "tcp_keepalives_interval": ("2", 0),
    "tcp_keepalives_count": ("3", 0),
    "tcp_user_timeout": ("15000", 120000),
}


def client_link_checks(url: str) -> dict[str, str]:
    """The libpq parameters to add to `url`'s: each one it does not set itself."""
    given = conninfo_to_dict(url)
    return {name: value for name, value in CLIENT_LINK_CHECKS.items() if name not in given}


def server_link_checks(url: str, server_version: int) -> str | None:
    """The statement that sets the server's side for a session of `url` on a server of
    `server_version` (`ConnectionInfo.server_version`), or None if nothing is left to set."""
    options = str(conninfo_to_dict(url).get("options") or os.environ.get("PGOPTIONS") or "")
    settings = [
        f"set_config('{name}', '{value}', false)"
        for name, (value, since) in SERVER_LINK_CHECKS.items()
        if server_version >= since and name not in options.replace("-", "_")
    ]
    return f"SELECT {', '.join(settings)}" if settings else None
