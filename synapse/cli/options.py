"""Every setting of the `synapse` command line, in one table: flag · environment variable ·
config-file key · parser.

A setting is looked up in that order (the flag, then `$SYNAPSE_…`, then the key of the TOML file
given with `--config`; `synapse.cli.settings.Settings`), and its flag is declared from the same
row (`synapse.cli.parser`), so a flag, its variable, its key and the way its text is read cannot
drift apart. `CONFIG_KEYS` (the keys a config file may hold) follows from the table too.

    port = Settings.require(PORT)      # --port, $SYNAPSE_PORT, `port = 8080` in the file
"""

from __future__ import annotations

import argparse
import keyword
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from synapse.cli.logs import parse_log_level
from synapse.cli.parsers import (
    parse_a2a_binding,
    parse_a2a_bindings,
    parse_a2a_tenant,
    parse_a2a_token,
    parse_bool,
    parse_count,
    parse_http_url,
    parse_listen,
    parse_port,
    parse_positive,
    parse_positive_count,
    parse_push_prefix,
    parse_signing,
    parse_url,
)
from synapse.p2p.durations import parse_duration

T = TypeVar("T")


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One setting: where it is given and how its text is read.

    `key` None: the setting has no key of its own in the file (it is in a table, `[p2p]`, or
    only a flag and a variable). `repeatable`: the flag may be given several times, the
    variable holds a comma-separated list, the key a list of strings.
    """

    flag: str
    env: str | None
    key: str | None
    parse: Callable[[str], T]
    repeatable: bool = False
    #: The argparse destination: the flag's name in snake case (`--as` → `as_`).
    dest: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not self.dest:
            name = self.flag.lstrip("-").replace("-", "_")
            object.__setattr__(self, "dest", name + "_" if keyword.iskeyword(name) else name)

    def argument_type(self) -> Callable[[str], T]:
        """The parser for argparse (`type=`): a value it refuses is a usage error that says
        why, at parse time, like any other bad flag."""

        def convert(text: str) -> T:
            try:
                return self.parse(text)
            except ValueError as exc:
                raise argparse.ArgumentTypeError(str(exc)) from exc

        convert.__name__ = self.dest
        return convert

    def described(self, text: str) -> str:
        """`text` for `--help`, naming the environment variable that also sets it."""
        if self.env is None:
            return text
        listed = ", comma-separated" if self.repeatable else ""
        return f"{text} (${self.env}{listed})"


# --- where a peer is and who it is -------------------------------------------------------------
CONFIG = Setting("--config", "SYNAPSE_CONFIG", None, str)
AGENT_ID = Setting("--agent-id", "SYNAPSE_AGENT_ID", "agent_id", str)
HOST = Setting("--host", "SYNAPSE_HOST", "host", str)
PORT = Setting("--port", "SYNAPSE_PORT", "port", parse_port)
ENDPOINT = Setting("--endpoint", "SYNAPSE_ENDPOINT", "endpoint", parse_url)
STORE = Setting("--store", "SYNAPSE_STORE", "store", str)
HANDLER = Setting("--handler", "SYNAPSE_HANDLER", "handler", str)
ROUTE = Setting("--route", "SYNAPSE_ROUTE", "route", str)
SIGNING = Setting("--signing", "SYNAPSE_SIGNING", "signing", parse_signing)
# --- the client commands (send, caps, ping, outbox) ---------------------------------------------
AS = Setting("--as", "SYNAPSE_AS", "as", str)
TARGET = Setting("--target", "SYNAPSE_TARGET", "target", parse_url)
LISTEN = Setting("--listen", "SYNAPSE_LISTEN", "listen", parse_listen)
RETRIES = Setting("--retries", "SYNAPSE_RETRIES", "retries", parse_count)
# --- secrets and partners -----------------------------------------------------------------------
SECRET = Setting("--secret", "SYNAPSE_SECRET", "secret", str)
SECRET_FILE = Setting("--secret-file", "SYNAPSE_SECRET_FILE", "secret_file", str)
PEER = Setting("--peer", "SYNAPSE_PEERS", None, str, repeatable=True)  # [[peer]] in the file
AUDIT_KEY_FILE = Setting(
    "--audit-key-file", "SYNAPSE_AUDIT_KEY_FILES", "audit_key_files", str, repeatable=True
)
PEER_SECRET_FILE = Setting(
    "--peer-secret-file", "SYNAPSE_PEER_SECRET_FILES", None, str, repeatable=True
)
ALLOW_SHARED_SECRET = Setting(
    "--allow-shared-secret", "SYNAPSE_ALLOW_SHARED_SECRET", "allow_shared_secret", parse_bool
)
ALLOW_WEAK_SECRET = Setting(
    "--allow-weak-secret", "SYNAPSE_ALLOW_WEAK_SECRET", "allow_weak_secret", parse_bool
)
# --- output --------------------------------------------------------------------------------------
VERBOSE = Setting("--verbose", "SYNAPSE_VERBOSE", "verbose", parse_bool)
LOG_JSON = Setting("--log-json", "SYNAPSE_LOG_JSON", "log_json", parse_bool)
LOG_LEVEL = Setting("--log-level", "SYNAPSE_LOG_LEVEL", "log_level", parse_log_level)
# --- serve: the runtime (these live in the file's [p2p] table) ----------------------------------
RETAIN = Setting("--retain", "SYNAPSE_RETAIN", None, parse_duration)
DRAIN_TIMEOUT = Setting("--drain-timeout", "SYNAPSE_DRAIN_TIMEOUT", None, parse_duration)
LEASE_TTL = Setting("--lease-ttl", "SYNAPSE_LEASE_TTL", None, parse_duration)
RATE_LIMIT = Setting("--rate-limit", "SYNAPSE_RATE_LIMIT", None, parse_positive)
MAX_TASKS_PER_PARTNER = Setting(
    "--max-tasks-per-partner", "SYNAPSE_MAX_TASKS_PER_PARTNER", None, parse_count
)
# --- serve: operations ---------------------------------------------------------------------------
CONSOLE = Setting("--console", "SYNAPSE_CONSOLE", "console", parse_bool)
CONSOLE_TOKENS = Setting(
    "--console-token", "SYNAPSE_CONSOLE_TOKENS", "console_tokens", parse_a2a_token, repeatable=True
)
OTEL = Setting("--otel", "SYNAPSE_OTEL", "otel", parse_bool)
# --- serve: A2A ----------------------------------------------------------------------------------
A2A = Setting("--a2a", "SYNAPSE_A2A", "a2a", parse_bool)
A2A_PUSH_ALLOW = Setting(
    "--a2a-push-allow",
    "SYNAPSE_A2A_PUSH_ALLOW",
    "a2a_push_allow",
    parse_push_prefix,
    repeatable=True,
)
A2A_TOKENS = Setting(
    "--a2a-token", "SYNAPSE_A2A_TOKENS", "a2a_tokens", parse_a2a_token, repeatable=True
)
A2A_PUSH_DISABLE_AFTER = Setting(
    "--a2a-push-disable-after",
    "SYNAPSE_A2A_PUSH_DISABLE_AFTER",
    "a2a_push_disable_after",
    parse_positive_count,
)
A2A_V03_CARD = Setting("--a2a-v03-card", "SYNAPSE_A2A_V03_CARD", "a2a_v03_card", parse_bool)
A2A_TENANTS = Setting(
    "--a2a-tenant", "SYNAPSE_A2A_TENANTS", "a2a_tenants", parse_a2a_tenant, repeatable=True
)
A2A_TOKEN_FILE = Setting("--a2a-token-file", "SYNAPSE_A2A_TOKEN_FILE", "a2a_token_file", str)
A2A_DEFAULT_TASK_TYPE = Setting(
    "--a2a-default-task-type", "SYNAPSE_A2A_DEFAULT_TASK_TYPE", "a2a_default_task_type", str
)
A2A_PUBLIC_URL = Setting("--a2a-public-url", "SYNAPSE_A2A_PUBLIC_URL", "a2a_public_url", parse_url)
A2A_BINDINGS = Setting("--a2a-bindings", "SYNAPSE_A2A_BINDINGS", "a2a_bindings", parse_a2a_bindings)
A2A_GRPC_PORT = Setting("--a2a-grpc-port", "SYNAPSE_A2A_GRPC_PORT", "a2a_grpc_port", parse_port)
A2A_GRPC_PUBLIC_ADDRESS = Setting(
    "--a2a-grpc-public-address", "SYNAPSE_A2A_GRPC_PUBLIC_ADDRESS", "a2a_grpc_public_address", str
)
A2A_CARD_SIGNING_KEY = Setting(
    "--a2a-card-signing-key", "SYNAPSE_A2A_CARD_SIGNING_KEY", "a2a_card_signing_key", str
)
A2A_CARD_SIGNING_KID = Setting(
    "--a2a-card-signing-kid", "SYNAPSE_A2A_CARD_SIGNING_KID", "a2a_card_signing_kid", str
)
# --- send to an A2A agent ------------------------------------------------------------------------
A2A_TOKEN = Setting("--a2a-token", "SYNAPSE_A2A_TOKEN", "a2a_token", str)
A2A_BINDING = Setting("--a2a-binding", "SYNAPSE_A2A_BINDING", "a2a_binding", parse_a2a_binding)
A2A_OAUTH_CLIENT = Setting(
    "--a2a-oauth-client", "SYNAPSE_A2A_OAUTH_CLIENT", "a2a_oauth_client", str
)
A2A_OAUTH_SECRET_FILE = Setting(
    "--a2a-oauth-secret-file", "SYNAPSE_A2A_OAUTH_SECRET_FILE", "a2a_oauth_secret_file", str
)
A2A_API_KEY_FILE = Setting(
    "--a2a-api-key-file", "SYNAPSE_A2A_API_KEY_FILE", "a2a_api_key_file", str
)
A2A_BASIC_FILE = Setting("--a2a-basic-file", "SYNAPSE_A2A_BASIC_FILE", "a2a_basic_file", str)
A2A_CARD_JWKS = Setting("--a2a-card-jwks", "SYNAPSE_A2A_CARD_JWKS", "a2a_card_jwks", str)
A2A_REQUIRE_SIGNED_CARD = Setting(
    "--a2a-require-signed-card",
    "SYNAPSE_A2A_REQUIRE_SIGNED_CARD",
    "a2a_require_signed_card",
    parse_bool,
)
# --- TLS -----------------------------------------------------------------------------------------
TLS_CERT = Setting("--tls-cert", "SYNAPSE_TLS_CERT", "tls_cert", str)
TLS_KEY = Setting("--tls-key", "SYNAPSE_TLS_KEY", "tls_key", str)
TLS_CLIENT_CA = Setting("--tls-client-ca", "SYNAPSE_TLS_CLIENT_CA", "tls_client_ca", str)
TLS_CA = Setting("--tls-ca", "SYNAPSE_TLS_CA", "tls_ca", str)
TLS_CLIENT_CERT = Setting("--tls-client-cert", "SYNAPSE_TLS_CLIENT_CERT", "tls_client_cert", str)
TLS_CLIENT_KEY = Setting("--tls-client-key", "SYNAPSE_TLS_CLIENT_KEY", "tls_client_key", str)
TLS_KEY_PASSWORD_FILE = Setting(
    "--tls-key-password-file", "SYNAPSE_TLS_KEY_PASSWORD_FILE", "tls_key_password_file", str
)
TLS_CRL = Setting("--tls-crl", "SYNAPSE_TLS_CRL", "tls_crl", str)

#: The table: every setting above.
# --- mcp: the MCP server in front of partners (docs/mcp.md) ------------------------------------

MCP_HTTP = Setting("--http", "SYNAPSE_MCP_HTTP", "mcp_http", parse_listen)
MCP_TOKENS = Setting(
    "--mcp-token", "SYNAPSE_MCP_TOKENS", "mcp_tokens", parse_a2a_token, repeatable=True
)
MCP_OAUTH_ISSUER = Setting(
    "--mcp-oauth-issuer", "SYNAPSE_MCP_OAUTH_ISSUER", "mcp_oauth_issuer", parse_http_url
)
MCP_OAUTH_JWKS = Setting(
    "--mcp-oauth-jwks", "SYNAPSE_MCP_OAUTH_JWKS", "mcp_oauth_jwks", parse_http_url
)
MCP_OAUTH_AUDIENCE = Setting(
    "--mcp-oauth-audience", "SYNAPSE_MCP_OAUTH_AUDIENCE", "mcp_oauth_audience", str
)
MCP_ALLOW_ANONYMOUS = Setting(
    "--mcp-allow-anonymous", "SYNAPSE_MCP_ALLOW_ANONYMOUS", "mcp_allow_anonymous", parse_bool
)
MCP_PUBLIC_URL = Setting("--mcp-public-url", "SYNAPSE_MCP_PUBLIC_URL", "mcp_public_url", parse_url)
MCP_A2A_AGENTS = Setting(
    "--a2a-agent", "SYNAPSE_MCP_A2A_AGENTS", "mcp_a2a_agents", str, repeatable=True
)
MCP_WAIT = Setting("--wait", "SYNAPSE_MCP_WAIT", "mcp_wait", parse_duration)
#: serve: offer an MCP server's tools as task types (`McpToolsHandler`).
HANDLER_MCP = Setting("--handler-mcp", "SYNAPSE_HANDLER_MCP", "handler_mcp", str)

SETTINGS: tuple[Setting[Any], ...] = tuple(
    value for value in list(globals().values()) if isinstance(value, Setting)
)

#: Keys of the file that are tables rather than settings: partners, `P2PConfig` fields, the
#: HTTP server's limits, the A2A security schemes.
TABLE_KEYS = frozenset({"peer", "p2p", "http", "a2a_security"})
#: Top-level keys a config file may hold (a typo is an error, not a silently ignored key).
CONFIG_KEYS = frozenset(s.key for s in SETTINGS if s.key is not None) | TABLE_KEYS
