"""The command line's security settings: TLS files, secrets kept off the command line, the
shared-secret switch, and the A2A security schemes of `serve --a2a` (docs/security.md).

Each setting has a flag, a `SYNAPSE_…` variable and a config-file key, like every other one
(`synapse.cli.settings`). Secrets are best given as files (`--secret-file`,
`--peer-secret-file`, `--a2a-token-file`, `--tls-key-password-file`) or environment
variables: `ps` shows every process's command line to every user of the machine.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from synapse.cli.errors import CliError

if TYPE_CHECKING:
    from synapse.cli.settings import Settings
    from synapse.transport.tls import TLSConfig

#: Config-file keys of this module (merged into `settings.CONFIG_KEYS`).
SECURITY_KEYS = frozenset(
    {
        "secret_file",
        "allow_shared_secret",
        "tls_cert",
        "tls_key",
        "tls_client_ca",
        "tls_ca",
        "tls_client_cert",
        "tls_client_key",
        "tls_key_password_file",
        "a2a_token_file",
        "a2a_security",
        "a2a_card_signing_key",
        "a2a_card_signing_kid",
    }
)
#: Extra keys of a `[[peer]]` table.
PEER_SECURITY_KEYS = frozenset({"secret_env"})

#: (flag, dest, environment variable, config key, help) of the TLS files.
TLS_FLAGS: tuple[tuple[str, str, str, str, str], ...] = (
    ("--tls-cert", "tls_cert", "SYNAPSE_TLS_CERT", "tls_cert", "our certificate (PEM chain)"),
    ("--tls-key", "tls_key", "SYNAPSE_TLS_KEY", "tls_key", "its private key (PEM)"),
    (
        "--tls-client-ca",
        "tls_client_ca",
        "SYNAPSE_TLS_CLIENT_CA",
        "tls_client_ca",
        "require client certificates issued by this CA (mTLS); a partner's certificate must "
        "name its agent id",
    ),
    (
        "--tls-ca",
        "tls_ca",
        "SYNAPSE_TLS_CA",
        "tls_ca",
        "verify the servers we call against this CA instead of the system's",
    ),
    (
        "--tls-client-cert",
        "tls_client_cert",
        "SYNAPSE_TLS_CLIENT_CERT",
        "tls_client_cert",
        "the certificate we present to servers that ask (default: --tls-cert when "
        "--tls-client-ca is set)",
    ),
    (
        "--tls-client-key",
        "tls_client_key",
        "SYNAPSE_TLS_CLIENT_KEY",
        "tls_client_key",
        "its private key",
    ),
    (
        "--tls-key-password-file",
        "tls_key_password_file",
        "SYNAPSE_TLS_KEY_PASSWORD_FILE",
        "tls_key_password_file",
        "file holding the password of encrypted keys",
    ),
)


def add_tls_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("TLS (docs/security.md)")
    for flag, dest, env, _key, text in TLS_FLAGS:
        group.add_argument(flag, dest=dest, metavar="PATH", help=f"{text} (${env})")


def add_secret_flags(group: argparse._ArgumentGroup, *, serve: bool) -> None:
    """`--secret-file`, `--peer-secret-env` (and, for serve, `--allow-shared-secret`)."""
    group.add_argument(
        "--secret-file",
        metavar="PATH",
        help="file holding the default secret (first line); keeps it out of `ps` "
        "($SYNAPSE_SECRET_FILE)",
    )
    group.add_argument(
        "--peer-secret-env",
        action="append",
        metavar="PARTNER_ID=VAR",
        help="that partner's secrets from environment variable VAR (comma-separated, newest "
        "first); repeatable",
    )
    if serve:
        group.add_argument(
            "--allow-shared-secret",
            action="store_true",
            default=None,
            help="accept one secret shared by several partners (any of them can then sign "
            "as another; refused by default; $SYNAPSE_ALLOW_SHARED_SECRET)",
        )


def read_first_line(path: Path, what: str) -> str:
    try:
        text = path.expanduser().read_text(encoding="utf-8")
    except OSError as exc:
        raise CliError(f"cannot read {what} {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise CliError(f"{what} {path} is not UTF-8 text") from exc
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    raise CliError(f"{what} {path} is empty")


def secret_from_file(s: Settings) -> str | None:
    """The default secret from `--secret-file` / `$SYNAPSE_SECRET_FILE` / `secret_file`
    (a relative path in the config file is relative to that file)."""
    flag = getattr(s.args, "secret_file", None) or s.env.get("SYNAPSE_SECRET_FILE") or None
    if flag is not None:
        return read_first_line(Path(flag), "secret file")
    raw = s.config.values.get("secret_file")
    if raw is None:
        return None
    if not isinstance(raw, str) or s.config.path is None:
        raise CliError(f"config file {s.config.path}: `secret_file` must be a path")
    return read_first_line(s.config.path.parent / Path(raw).expanduser(), "secret file")


def secrets_from_env(env: Mapping[str, str], variable: str, partner: str) -> tuple[str, ...]:
    value = env.get(variable, "")
    secrets = tuple(item.strip() for item in value.split(",") if item.strip())
    if not secrets:
        raise CliError(f"environment variable {variable} (secrets of {partner!r}) is empty")
    return secrets


def peer_secret_envs(s: Settings) -> dict[str, str]:
    """`--peer-secret-env ID=VAR` flags: partner → environment variable."""
    from synapse.cli.settings import parse_pair

    found: dict[str, str] = {}
    for item in getattr(s.args, "peer_secret_env", None) or ():
        try:
            agent_id, variable = parse_pair(item, "PARTNER_ID=VAR")
        except ValueError as exc:
            raise CliError(f"bad --peer-secret-env: {exc}") from exc
        found[agent_id] = variable.strip()
    return found


def allow_shared_secret(s: Settings) -> bool:
    return s.switch("allow_shared_secret", "SYNAPSE_ALLOW_SHARED_SECRET", "allow_shared_secret")


def secrets_on_command_line(args: argparse.Namespace) -> list[str]:
    """The flags of this run that carried a secret itself (visible to `ps`)."""
    shown = []
    if getattr(args, "secret", None):
        shown.append("--secret")
    if getattr(args, "a2a_token", None):
        shown.append("--a2a-token")
    return shown


def tls_config(s: Settings, *, serving: bool) -> TLSConfig | None:
    """The `TLSConfig` of the TLS settings, or None when none is set."""
    from synapse.transport.tls import TLSConfig

    values: dict[str, str] = {}
    for _flag, dest, env, config_key, _text in TLS_FLAGS:
        value = s.get(dest, env, config_key, str)
        if value:
            values[dest] = value
    if not values:
        return None
    password: str | None = None
    if "tls_key_password_file" in values:
        password = read_first_line(Path(values["tls_key_password_file"]), "key password file")
    cert, key = values.get("tls_cert"), values.get("tls_key")
    client_cert, client_key = values.get("tls_client_cert"), values.get("tls_client_key")
    if client_cert is None and client_key is None and "tls_client_ca" in values:
        # A peer that requires client certificates presents its own to its partners.
        client_cert, client_key = cert, key
    try:
        config = TLSConfig(
            cert=cert if serving else None,
            key=key if serving else None,
            client_ca=values.get("tls_client_ca") if serving else None,
            ca=values.get("tls_ca"),
            client_cert=client_cert,
            client_key=client_key,
            key_password=password,
        )
        # Load the files now: a bad path or key is one line at start, not a failure later.
        config.server_context()
        config.client_context()
    except ValueError as exc:
        raise CliError(f"bad TLS settings: {exc}") from exc
    return config


__all__ = [
    "PEER_SECURITY_KEYS",
    "SECURITY_KEYS",
    "add_secret_flags",
    "add_tls_flags",
    "allow_shared_secret",
    "peer_secret_envs",
    "secret_from_file",
    "secrets_from_env",
    "secrets_on_command_line",
    "tls_config",
]
