"""`synapse migrate --store URL`: apply the PostgreSQL store's schema migrations by hand.

`synapse serve` applies them at start too; this command is for upgrades run ahead of a
rolling restart (see docs/deploy.md, "Upgrades"), and for a database the serving role may not
alter. It parses its own flags, so it does not depend on the serve settings.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any, Protocol, TextIO

from synapse._distribution import install
from synapse.cli.errors import Exit
from synapse.cli.flags import (
    QUIET_VERBOSE,
    STORE_CONFIG,
    HelpFormatter,
    add_output_flags,
    epilog,
)
from synapse.cli.options import STORE, add_setting
from synapse.cli.settings import Settings
from synapse.store import is_postgres_url

EPILOG = "Exit status: 0 up to date, 2 usage error or the database refused or is unreachable."


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "migrate",
        help="apply the schema migrations of a PostgreSQL --store",
        description="Bring the schema of a PostgreSQL store up to this version of synapse, "
        "each migration once, in one transaction (safe while replicas start: they wait for "
        "it). An SQLite file needs no command: it is created and checked when opened.",
        epilog=epilog(
            EPILOG,
            [
                "synapse migrate --store postgresql://synapse@db.internal:5432/synapse",
                "synapse migrate --config exec.toml --status",
            ],
        ),
        formatter_class=HelpFormatter,
    )
    add_setting(parser, STORE, help="postgresql://USER@HOST:PORT/DB", metavar="URL")
    parser.add_argument("--status", action="store_true", help="only print the schema version")
    add_output_flags(parser, config_holds=STORE_CONFIG, verbose_logs=QUIET_VERBOSE)
    parser.set_defaults(run=run_migrate)


class _Context(Protocol):
    args: argparse.Namespace
    env: Mapping[str, str]
    out: TextIO
    err: TextIO
    settings: Settings

    def logging(self, *, quiet: bool) -> None: ...


def run_migrate(ctx: _Context) -> int:
    args, out, err = ctx.args, ctx.out, ctx.err
    ctx.logging(quiet=True)
    url = ctx.settings.get(STORE)
    if not url:
        err.write("synapse: migrate needs --store URL (or $SYNAPSE_STORE, `store` in --config)\n")
        return Exit.USAGE
    if not is_postgres_url(url):
        err.write(f"synapse: {url!r} is not a postgresql:// URL (only PostgreSQL migrates)\n")
        return Exit.USAGE
    try:
        import psycopg

        from synapse.store.migrations import latest_version
        from synapse.store.postgres import migrate, schema_version
    except ImportError as exc:
        err.write(f"synapse: the PostgreSQL store needs psycopg: {install('postgres')} ({exc})\n")
        return Exit.USAGE
    try:
        if args.status:
            with psycopg.connect(url, autocommit=True) as conn:
                found = schema_version(conn)
            out.write(f"schema version {found} (this synapse: {latest_version()})\n")
            return Exit.OK
        before, applied = migrate(url)
    except (psycopg.Error, RuntimeError) as exc:
        err.write(f"synapse: migrate: {' '.join(str(exc).split())}\n")  # one line
        return Exit.USAGE
    for migration in applied:
        out.write(f"applied {migration.version:04d} {migration.name}\n")
    after = before + len(applied)
    out.write(f"schema version {after}" + (" (already up to date)" if not applied else "") + "\n")
    return Exit.OK
