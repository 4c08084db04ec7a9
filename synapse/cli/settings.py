"""Settings of the command line from three sources: flags, then environment, then a TOML file.

Every setting has one flag, one `SYNAPSE_…` environment variable and one key of the config file
(`--config PATH` or `SYNAPSE_CONFIG`), declared together in one row of `synapse.cli.options`,
and the first source that has it wins. Partners merge
instead: the config file's `[[peer]]` entries, then `SYNAPSE_PEERS`, then `--peer` flags, a later
source replacing an earlier one's entry for the same agent id. A partner's own secrets (a
`--peer-secret-file`, `SYNAPSE_PEER_SECRET_FILES`, or the file's `secrets` / `secret_file`) beat
the default secret (`--secret`, `SYNAPSE_SECRET`, `secret`), whatever their source.

    agent_id = "agent-e"
    port = 8080
    secret = "shared-secret"

    [send]                            # for one command: [serve] [send] [caps] [ping] [outbox]
    as = "agent-e"

    [[peer]]
    agent_id = "agent-r"
    endpoint = "http://127.0.0.1:9001/synapse/callback"
    secrets = ["newest", "older"]     # or: secret = "…", or: secret_file = "r.secrets"

    [p2p]                             # any P2PConfig field
    max_retries = 3

    [http]                            # the server's limits (synapse.transport.guard)
    header_timeout = 10.0             # seconds; body_timeout = 30.0, keepalive_timeout = 75.0
    max_connections = 1024

Every value is typed as TOML writes it (see `synapse.cli.typed_settings`): `port = "8080"` is
an error naming the key and the file, not a port.
"""

from __future__ import annotations

import argparse
import dataclasses
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

from synapse.cli.errors import CliError
from synapse.cli.options import ALLOW_WEAK_SECRET, CONFIG_KEYS, RETRIES, SECRET, Setting
from synapse.cli.parsers import (
    parse_pair,
    parse_url,
)
from synapse.cli.security_settings import (
    PEER_SECURITY_KEYS,
    allow_shared_secret,
    peer_secret_envs,
    secret_from_file,
    secret_strength,
    secrets_from_env,
)
from synapse.cli.typed_settings import (
    FileValues,
    PeerTable,
    toml_type_of,
    typed,
    typed_dataclass,
)
from synapse.p2p.config import P2PConfig
from synapse.p2p.durations import parse_duration
from synapse.transport.guard import HttpLimits
from synapse.transport.partners import Partner, PartnerRegistry
from synapse.transport.server import DEFAULT_PATH
from synapse.types.errors import unknown_key

if TYPE_CHECKING:
    from synapse.humans import HumansConfig

T = TypeVar("T")


def callback_url(host: str, port: int, path: str = DEFAULT_PATH) -> str:
    """The URL a peer listening on `host:port` receives POSTs on."""
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"http://{shown}:{port}{path}"


# --- the config file ---------------------------------------------------------------------------

#: Tables of `synapse.humans` (read by `serve`): `[humans]` and the `[[notify]]` routes.
HUMANS_TABLES = frozenset({"humans", "notify"})
#: Tables whose keys apply to one command only, over the top-level ones (`[send]`, …).
COMMAND_TABLES = frozenset({"serve", "send", "caps", "ping", "outbox"})
PEER_KEYS = (
    frozenset({"agent_id", "endpoint", "secret", "secrets", "secret_file"}) | PEER_SECURITY_KEYS
)


@dataclass(frozen=True, slots=True)
class PeerEntry:
    """A partner from one source: its endpoint and, if it has its own, its secrets."""

    agent_id: str
    endpoint: str | None = None
    secrets: tuple[str, ...] | None = None
    #: The environment variable holding its secrets (`secret_env` of its [[peer]] table).
    secret_env: str | None = None


@dataclass(frozen=True, slots=True)
class ConfigFile:
    path: Path | None = None
    values: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    peers: tuple[PeerEntry, ...] = ()
    p2p: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    http: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    #: `[humans]` and the `[[notify]]` routes (`synapse.humans`), read by `serve`.
    humans: Mapping[str, Any] | None = None
    notify: tuple[Mapping[str, Any], ...] = ()


def read_secret_file(path: Path, partner: str) -> tuple[str, ...]:
    """One secret a line, newest first; blank lines are skipped."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CliError(
            f"cannot read the secret file of {partner!r}: {path}: {exc.strerror}"
        ) from exc
    except UnicodeDecodeError as exc:
        raise CliError(f"secret file {path} of {partner!r} is not UTF-8 text") from exc
    secrets = tuple(line.strip() for line in text.splitlines() if line.strip())
    if not secrets:
        raise CliError(f"secret file {path} of {partner!r} holds no secret")
    return secrets


def load_config(path: str | None, command: str | None = None) -> ConfigFile:
    """Read and check the TOML config file (an empty config when `path` is None).

    The keys of the `[command]` table, if any, win over the top-level ones.
    """
    if path is None:
        return ConfigFile()
    file = Path(path)
    try:
        data = tomllib.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CliError(f"cannot read config file {file}: {exc.strerror}") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise CliError(f"config file {file} is not valid TOML: {exc}") from exc
    unknown = sorted(set(data) - CONFIG_KEYS - COMMAND_TABLES - HUMANS_TABLES)
    if unknown:
        known = CONFIG_KEYS | COMMAND_TABLES | HUMANS_TABLES
        raise CliError(unknown_key(f"config file {file}", unknown[0], known))
    for table in COMMAND_TABLES & set(data):
        section = data[table]
        if not isinstance(section, dict):
            raise CliError(f"config file {file}: `{table}` must be a table ([{table}])")
        tables = {"peer", "p2p", "http"}
        unknown = sorted(set(section) - CONFIG_KEYS - tables)
        if unknown:
            raise CliError(unknown_key(f"config file {file}: [{table}]", unknown[0], CONFIG_KEYS))
        if tables & set(section):
            bad = sorted(tables & set(section))[0]
            raise CliError(f"config file {file}: [{bad}] goes at the top level, not in [{table}]")
        typed(section, FileValues, file=file, table=table)
    peers_raw = data.get("peer", [])
    if not isinstance(peers_raw, list) or not all(isinstance(p, dict) for p in peers_raw):
        raise CliError(f"config file {file}: `peer` must be an array of tables ([[peer]])")
    peers = tuple(_config_peer(file, i, entry) for i, entry in enumerate(peers_raw))
    p2p, http = data.get("p2p", {}), data.get("http", {})
    for name, table_value in (("p2p", p2p), ("http", http)):
        if not isinstance(table_value, dict):
            raise CliError(f"config file {file}: `{name}` must be a table ([{name}])")
    values = {
        k: v for k, v in data.items() if k in CONFIG_KEYS and k not in ("peer", "p2p", "http")
    }
    typed(values, FileValues, file=file, table=None)
    if command in data:
        values.update(data[command])
    humans, notify = data.get("humans"), data.get("notify", [])
    if humans is not None and not isinstance(humans, dict):
        raise CliError(f"config file {file}: `humans` must be a table ([humans])")
    if not isinstance(notify, list) or not all(isinstance(n, dict) for n in notify):
        raise CliError(f"config file {file}: `notify` must be an array of tables ([[notify]])")
    if notify and humans is None:
        raise CliError(f"config file {file}: [[notify]] routes need a [humans] table")
    return ConfigFile(
        path=file,
        values=values,
        peers=peers,
        p2p=p2p,
        http=http,
        humans=humans,
        notify=tuple(notify),
    )


def _config_peer(file: Path, index: int, entry: Mapping[str, Any]) -> PeerEntry:
    where = f"config file {file}: [[peer]] #{index + 1}"
    unknown = sorted(set(entry) - PEER_KEYS)
    if unknown:
        raise CliError(unknown_key(where, unknown[0], PEER_KEYS))
    typed(entry, PeerTable, file=file, table=f"[[peer]] #{index + 1}")
    agent_id, endpoint = entry.get("agent_id"), entry.get("endpoint")
    if not isinstance(agent_id, str) or not agent_id:
        raise CliError(f"{where}: needs a string `agent_id`")
    if not isinstance(endpoint, str):
        raise CliError(f"{where} ({agent_id}): needs a string `endpoint`")
    secrets: tuple[str, ...] | None = None
    if "secrets" in entry:
        raw = entry["secrets"]
        if not isinstance(raw, list) or not raw or not all(isinstance(s, str) and s for s in raw):
            raise CliError(f"{where} ({agent_id}): `secrets` must be a list of non-empty strings")
        secrets = tuple(raw)
    elif "secret" in entry:
        if not isinstance(entry["secret"], str) or not entry["secret"]:
            raise CliError(f"{where} ({agent_id}): `secret` must be a non-empty string")
        secrets = (entry["secret"],)
    elif "secret_file" in entry:
        if not isinstance(entry["secret_file"], str):
            raise CliError(f"{where} ({agent_id}): `secret_file` must be a path")
        secret_path = file.parent / Path(entry["secret_file"]).expanduser()
        secrets = read_secret_file(secret_path, agent_id)
    secret_env = entry.get("secret_env")
    if secret_env is not None and (not isinstance(secret_env, str) or secrets is not None):
        raise CliError(f"{where} ({agent_id}): `secret_env` is a variable name, used alone")
    return PeerEntry(agent_id, endpoint, secrets, secret_env)


# --- resolution ------------------------------------------------------------------------------


class Settings:
    """Looks each setting up in the flags, then the environment, then the config file."""

    def __init__(
        self, args: argparse.Namespace, env: Mapping[str, str], config: ConfigFile
    ) -> None:
        self.args = args
        self.env = env
        self.config = config
        #: Where warnings about the settings go (a `synapse: warning: …` line each, once).
        self.warnings: TextIO | None = None
        self._warned: set[str] = set()

    def warn(self, text: str) -> None:
        if self.warnings is not None and text not in self._warned:
            self._warned.add(text)
            self.warnings.write(f"synapse: warning: {text}\n")

    @classmethod
    def load(cls, args: argparse.Namespace, env: Mapping[str, str]) -> Settings:
        path = getattr(args, "config", None) or env.get("SYNAPSE_CONFIG") or None
        return cls(args, env, load_config(path, getattr(args, "command", None)))

    def get(self, setting: Setting[T], default: T | None = None) -> T | None:
        """`setting` from its flag, else its environment variable, else its key in the file,
        else `default` (each source's text read by the setting's parser)."""
        dest, env, key, parse = setting.dest, setting.env, setting.key, setting.parse
        value = getattr(self.args, dest, None)
        if value is not None:
            result: T = value
            return result
        if env is not None and self.env.get(env, "") != "":
            try:
                return parse(self.env[env])
            except ValueError as exc:
                raise CliError(f"environment variable {env}: {exc}") from exc
        if key is not None and key in self.config.values:
            raw = self.config.values[key]
            expected = toml_type_of(parse)
            # Typed as written: `port = "8080"` or `secret = 5` is an error, not converted.
            if expected is not None and not (
                isinstance(raw, expected) and (bool in expected or not isinstance(raw, bool))
            ):
                want = " or ".join(_TOML_NAMES.get(t, t.__name__) for t in expected)
                got = _TOML_NAMES.get(type(raw), type(raw).__name__)
                raise CliError(f"config file {self.config.path}: `{key}` must be {want}, not {got}")
            try:
                if isinstance(raw, str):
                    return parse(raw)
                if isinstance(raw, bool):
                    return parse("true" if raw else "false")
                if isinstance(raw, int):
                    return parse(str(raw))
            except ValueError as exc:
                raise CliError(f"config file {self.config.path}: `{key}`: {exc}") from exc
            raise CliError(f"config file {self.config.path}: `{key}` has the wrong type")
        return default

    def require(self, setting: Setting[T]) -> T:
        """`setting`, which must be given somewhere (else a usage error naming where)."""
        value = self.get(setting)
        if value is None:
            raise CliError(f"missing {_where(setting)}")
        return value

    def wanted(self, setting: Setting[T], missing: Missing, metavar: str, meaning: str) -> T | None:
        """`setting`, or None with a line for it in `missing` (`meaning`: what it is for)."""
        value = self.get(setting)
        if value is None:
            missing.add(_where(setting, meaning, metavar))
        return value

    def get_list(self, setting: Setting[T]) -> list[T]:
        """A repeatable setting: its flags, else its variable (comma-separated), else its key
        in the file (a list of strings, or one comma-separated string); each item parsed."""
        dest, flag, parse = setting.dest, setting.flag, setting.parse
        env, key = setting.env or "", setting.key or ""
        items: list[tuple[str, str]]
        flags = getattr(self.args, dest, None)
        if flags:
            items = [(flag, str(item)) for item in flags]
        elif self.env.get(env, "").strip():
            items = [(f"{env} entry", item) for item in _split_list(self.env[env])]
        elif key in self.config.values:
            raw = self.config.values[key]
            where = f"config file {self.config.path}: `{key}`"
            if isinstance(raw, str):
                raw = _split_list(raw)
            if not isinstance(raw, list) or not all(isinstance(item, str) for item in raw):
                raise CliError(f"{where} must be a list of strings")
            items = [(where, item) for item in raw]
        else:
            return []
        values: list[T] = []
        for where, item in items:
            try:
                values.append(parse(item))
            except ValueError as exc:
                raise CliError(f"bad {where} {item!r}: {exc}") from exc
        return values

    def switch(self, setting: Setting[bool]) -> bool:
        """A yes/no setting (its flag, declared with `default=None`, can only switch it on)."""
        value: bool | None = self.get(setting, False)
        return bool(value)

    # --- partners --------------------------------------------------------------------------

    def peer_entries(self) -> dict[str, PeerEntry]:
        """Partners by agent id, merged: config file, then `SYNAPSE_PEERS`, then `--peer`."""
        merged: dict[str, PeerEntry] = {p.agent_id: p for p in self.config.peers}

        def add(text: str, where: str) -> None:
            try:
                agent_id, endpoint = parse_pair(text, "PARTNER_ID=CALLBACK_URL")
                parse_url(endpoint)
            except ValueError as exc:
                raise CliError(f"bad {where} {text!r}: {exc}") from exc
            old = merged.get(agent_id)
            merged[agent_id] = PeerEntry(
                agent_id,
                endpoint,
                old.secrets if old else None,
                old.secret_env if old else None,
            )

        for item in _split_list(self.env.get("SYNAPSE_PEERS", "")):
            add(item, "SYNAPSE_PEERS entry")
        for item in getattr(self.args, "peer", None) or ():
            add(item, "--peer")
        return merged

    def own_secret_files(self) -> dict[str, Path]:
        """`--peer-secret-file` flags, else `SYNAPSE_PEER_SECRET_FILES` (`ID=PATH,…`)."""
        files: dict[str, Path] = {}
        items: Sequence[tuple[str, str]] = [
            ("SYNAPSE_PEER_SECRET_FILES entry", item)
            for item in _split_list(self.env.get("SYNAPSE_PEER_SECRET_FILES", ""))
        ] + [
            ("--peer-secret-file", item)
            for item in getattr(self.args, "peer_secret_file", None) or ()
        ]
        for where, item in items:
            try:
                agent_id, path = parse_pair(item, "PARTNER_ID=PATH")
            except ValueError as exc:
                raise CliError(f"bad {where}: {exc}") from exc
            files[agent_id] = Path(path).expanduser()
        return files

    def default_secret(self) -> str | None:
        """`--secret` / `$SYNAPSE_SECRET`, else the secret file, else the file's `secret`."""
        if getattr(self.args, "secret", None) or self.env.get("SYNAPSE_SECRET"):
            return self.get(SECRET)
        return secret_from_file(self) or self.get(SECRET)

    def partner(self, entry: PeerEntry, files: Mapping[str, Path], default: str | None) -> Partner:
        """`entry` as a `Partner`, with its own secrets if it has any, else `default`."""
        if entry.endpoint is None:
            raise CliError(f"partner {entry.agent_id!r} has no endpoint")
        secrets = self.secrets_of(entry, files, default)
        if secrets is None:
            raise CliError(f"no secret for partner {entry.agent_id!r}: give {NO_SECRET}")
        weak = secret_strength(entry.agent_id, secrets, self.switch(ALLOW_WEAK_SECRET))
        if weak is not None:
            self.warn(weak)
        try:
            return Partner(entry.agent_id, entry.endpoint, secrets)
        except ValueError as exc:
            raise CliError(f"partner {entry.agent_id!r}: {exc}") from exc

    def secrets_of(
        self, entry: PeerEntry, files: Mapping[str, Path], default: str | None
    ) -> tuple[str, ...] | None:
        """The secrets shared with `entry`: its own if it has any, else `default` (None if
        neither is given)."""
        variable = peer_secret_envs(self).get(entry.agent_id) or entry.secret_env
        if entry.agent_id in files:
            return read_secret_file(files[entry.agent_id], entry.agent_id)
        if variable:
            return secrets_from_env(self.env, variable, entry.agent_id)
        if entry.secrets is not None:
            return entry.secrets
        return (default,) if default else None

    def partners(self) -> list[Partner]:
        entries = self.peer_entries()
        files = self.own_secret_files()
        unknown = sorted(set(files) - set(entries))
        if unknown:
            raise CliError(
                f"--peer-secret-file for {unknown[0]!r}, which is not a partner (add --peer)"
            )
        default = self.default_secret()
        partners = [self.partner(entry, files, default) for entry in entries.values()]
        groups = PartnerRegistry(partners).shared_secrets()
        if groups and not allow_shared_secret(self):
            named = "; ".join(", ".join(group) for group in groups)
            raise CliError(
                f"partners share a secret ({named}): any of them could sign messages as "
                "another; give each its own (--peer-secret-file, --peer-secret-env, [[peer]] "
                "secret_file) or accept it with --allow-shared-secret "
                "(SYNAPSE_ALLOW_SHARED_SECRET=1, `allow_shared_secret = true`)"
            )
        return partners

    # --- the engine's settings ---------------------------------------------------------------

    def p2p_config(self, overrides: Mapping[str, Any] | None = None, **base: Any) -> P2PConfig:
        """`P2PConfig` from `base`, then the file's `[p2p]` table (each value's type checked),
        then `--retries` and the `overrides` (flags and environment); a duration may be
        written `30s`, `15m`, `7d`."""
        file_p2p = dict(self.config.p2p)
        for name in DURATION_SETTINGS & file_p2p.keys():
            if isinstance(file_p2p[name], str):
                try:
                    file_p2p[name] = parse_duration(file_p2p[name])
                except ValueError as exc:
                    raise CliError(
                        f"config file {self.config.path}: [p2p] `{name}` must be a number or "
                        f"a duration (30s, 15m, 12h, 7d), not {file_p2p[name]!r}"
                    ) from exc
        checked = typed_dataclass(file_p2p, P2PConfig, file=self.config.path, table="p2p")
        values = dict(base)
        values.update({name: getattr(checked, name) for name in file_p2p})
        values.update({k: v for k, v in (overrides or {}).items() if v is not None})
        retries = self.get(RETRIES)
        if retries is not None:
            values["max_retries"] = retries
        try:
            return P2PConfig(**values)
        except (TypeError, ValueError) as exc:
            raise CliError(f"bad [p2p] settings: {exc}") from exc

    def humans_config(self) -> HumansConfig | None:
        """The `HumansConfig` of the file's `[humans]` and `[[notify]]` (None without them)."""
        if self.config.humans is None:
            return None
        from synapse.humans import HumansConfigError, humans_config_from_toml

        base = self.config.path.parent if self.config.path else Path.cwd()
        try:
            return humans_config_from_toml(self.config.humans, self.config.notify, base=base)
        except HumansConfigError as exc:
            raise CliError(f"config file {self.config.path}: {exc}") from exc

    def http_limits(self) -> HttpLimits:
        """The server's timeouts and connection cap: `HttpLimits` from the `[http]` table."""
        return typed_dataclass(self.config.http, HttpLimits, file=self.config.path, table="http")


_TOML_NAMES: dict[type, str] = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "a boolean",
    list: "an array",
    dict: "a table",
}


#: `P2PConfig` fields the `[p2p]` table may also write as a duration string (`"7d"`).
DURATION_SETTINGS = frozenset(
    {
        "retain",
        "drain_timeout",
        "lease_ttl",
        "outbox_grace",
        "input_timeout",
        "task_timeout",
        "heartbeat_interval",
        "dead_letter_after",
        "request_timeout",
    }
)


def _split_list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


#: How a missing secret is given.
NO_SECRET = "--secret-file PATH, SYNAPSE_SECRET or --secret; or --peer-secret-file ID=PATH"


def _where(setting: Setting[Any], meaning: str = "", metavar: str = "") -> str:
    """How to give `setting`: `--as ID (our agent id; or SYNAPSE_AS, `as` in --config)`."""
    sources = [setting.env] if setting.env else []
    if setting.key:
        sources.append(f"`{setting.key}` in --config")
    if not meaning:
        return f"{setting.flag} (set it with {', '.join([setting.flag, *sources])})"
    flag = f"{setting.flag} {metavar}".strip()
    return f"{flag} ({meaning}; or {', '.join(sources)})" if sources else f"{flag} ({meaning})"


class Missing:
    """What a command lacks, gathered so that one run names all of it (not one a run)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, line: str) -> None:
        self.lines.append(line)

    def check(self) -> None:
        """Raise one usage error listing every missing setting, if any is."""
        if len(self.lines) == 1:
            raise CliError(f"missing {self.lines[0]}")
        if self.lines:
            listed = "".join(f"\n  {line}" for line in self.lines)
            raise CliError(f"missing {len(self.lines)} settings:{listed}")
