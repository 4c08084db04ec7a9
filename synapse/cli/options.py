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
    parse_extension_uri,
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
    #: What `--help` says of it (where it is set is added: `described`), and its value's name.
    help: str = field(default="", compare=False)
    metavar: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not self.dest:
            name = self.flag.lstrip("-").replace("-", "_")
            object.__setattr__(self, "dest", name + "_" if keyword.iskeyword(name) else name)

    def argument_type(self, *, keep_text: bool = False) -> Callable[[str], Any]:
        """The parser for argparse (`type=`): a value it refuses is a usage error that says
        why, at parse time, like any other bad flag. With `keep_text` the value is checked
        but kept as written (a repeatable flag's items are read with its variable's, by
        `Settings.get_list`)."""

        def convert(text: str) -> Any:
            try:
                value = self.parse(text)
            except ValueError as exc:
                raise argparse.ArgumentTypeError(str(exc)) from exc
            return text if keep_text else value

        convert.__name__ = self.dest
        return convert

    def described(self, text: str | None = None) -> str:
        """`text` (else the row's `help`) for `--help`, naming the environment variable that
        also sets it: inside the text's closing parenthesis, if it has one."""
        text = self.help if text is None else text
        if self.env is None:
            return text
        where = f"${self.env}" + (", comma-separated" if self.repeatable else "")
        if text.endswith(")"):
            return f"{text[:-1]}; {where})"
        return f"{text} ({where})"

    @property
    def is_switch(self) -> bool:
        """A yes/no setting: its flag takes no value and can only switch it on."""
        return self.parse is parse_bool


def add_setting(
    container: argparse._ActionsContainer,
    setting: Setting[Any],
    *,
    short: str | None = None,
    help: str | None = None,
    metavar: str | None = None,
) -> None:
    """`setting`'s flag, from its row: destination, parser, metavar, and a help that names its
    variable. `help` and `metavar` override the row's where one command says it otherwise."""
    flags = (short, setting.flag) if short else (setting.flag,)
    text = setting.described(help)
    if setting.is_switch:
        container.add_argument(
            *flags, dest=setting.dest, action="store_true", default=None, help=text
        )
        return
    options: dict[str, Any] = {"dest": setting.dest, "metavar": metavar or setting.metavar}
    if setting.parse is not str:  # read at parse time: a bad value is a usage error then
        options["type"] = setting.argument_type(keep_text=setting.repeatable)
    if setting.repeatable:
        options["action"] = "append"
    container.add_argument(*flags, help=text, **options)


def add_settings(container: argparse._ActionsContainer, *settings: Setting[Any]) -> None:
    """Each of `settings`, as its row says (`add_setting`)."""
    for setting in settings:
        add_setting(container, setting)


# --- where a peer is and who it is -------------------------------------------------------------
CONFIG = Setting("--config", "SYNAPSE_CONFIG", None, str)
AGENT_ID = Setting(
    "--agent-id",
    "SYNAPSE_AGENT_ID",
    "agent_id",
    str,
    help="the executor's agent id (or the [[peer]] at --target)",
    metavar="ID",
)
HOST = Setting(
    "--host", "SYNAPSE_HOST", "host", str, help="address to listen on (default 127.0.0.1)"
)
PORT = Setting("--port", "SYNAPSE_PORT", "port", parse_port, help="port to listen on, 0 for any")
ENDPOINT = Setting(
    "--endpoint",
    "SYNAPSE_ENDPOINT",
    "endpoint",
    parse_url,
    help=(
        "our callback URL as the executor has it, if not http://HOST:PORT/synapse/callback of "
        "--listen"
    ),
    metavar="URL",
)
STORE = Setting(
    "--store",
    "SYNAPSE_STORE",
    "store",
    str,
    help=(
        "where tasks, the outbox and dedup records live: an SQLite file, a "
        "postgresql://USER@HOST:PORT/DB database (replicas may share one), or memory (default)"
    ),
    metavar="PATH|URL|memory",
)
HANDLER = Setting(
    "--handler",
    "SYNAPSE_HANDLER",
    "handler",
    str,
    help=(
        "the TaskHandler to run, a class or an instance, or an agent of Pydantic AI, LangGraph "
        "or the OpenAI Agents SDK, served as it is (default: the demo handler)"
    ),
    metavar="MODULE:ATTR",
)
ROUTE = Setting(
    "--route",
    "SYNAPSE_ROUTE",
    "route",
    str,
    help=(
        "be a router: execute every task by requesting it of a capable partner of the pool this "
        "TOML file describes, instead of running a handler"
    ),
    metavar="POOL.toml",
)
SIGNING = Setting(
    "--signing",
    "SYNAPSE_SIGNING",
    "signing",
    parse_signing,
    help="signature mode (default header)",
    metavar="{header,body}",
)
# --- the client commands (send, caps, ping, outbox) ---------------------------------------------
AS = Setting(
    "--as",
    "SYNAPSE_AS",
    "as",
    str,
    help="our own agent id, as the executor knows us",
    metavar="AGENT_ID",
)
TARGET = Setting(
    "--target",
    "SYNAPSE_TARGET",
    "target",
    parse_url,
    help=(
        "the executor's callback URL, e.g. http://127.0.0.1:8080/synapse/callback (or a [[peer]] "
        "of --config)"
    ),
    metavar="URL",
)
LISTEN = Setting(
    "--listen",
    "SYNAPSE_LISTEN",
    "listen",
    parse_listen,
    help="where we receive the Synapse partners' callbacks",
    metavar="HOST:PORT",
)
RETRIES = Setting(
    "--retries",
    "SYNAPSE_RETRIES",
    "retries",
    parse_count,
    help=(
        "retries of a POST after a connection error, timeout, 429 or 5xx (default: 5 for serve, 2 "
        "for send/caps/ping)"
    ),
    metavar="N",
)
# --- secrets and partners -----------------------------------------------------------------------
SECRET = Setting(
    "--secret",
    "SYNAPSE_SECRET",
    "secret",
    str,
    help="secret shared with every partner without a --peer-secret-file",
    metavar="SECRET",
)
SECRET_FILE = Setting(
    "--secret-file",
    "SYNAPSE_SECRET_FILE",
    "secret_file",
    str,
    help="file holding the default secret (first line); keeps it out of `ps`",
    metavar="PATH",
)
PEER = Setting(
    "--peer",
    "SYNAPSE_PEERS",
    None,
    str,
    repeatable=True,
    help="a partner and the URL it receives POSTs on; repeatable",
    metavar="PARTNER_ID=CALLBACK_URL",
)  # [[peer]] in the file
AUDIT_KEY_FILE = Setting(
    "--audit-key-file", "SYNAPSE_AUDIT_KEY_FILES", "audit_key_files", str, repeatable=True
)
PEER_SECRET_FILE = Setting(
    "--peer-secret-file",
    "SYNAPSE_PEER_SECRET_FILES",
    None,
    str,
    repeatable=True,
    help="that partner's secrets, one a line, newest first; repeatable",
    metavar="PARTNER_ID=PATH",
)
ALLOW_SHARED_SECRET = Setting(
    "--allow-shared-secret",
    "SYNAPSE_ALLOW_SHARED_SECRET",
    "allow_shared_secret",
    parse_bool,
    help=(
        "accept one secret shared by several partners (any of them can then sign as another; "
        "refused by default)"
    ),
)
#: An HMAC-SHA256 key shorter than this is refused (unless --allow-weak-secret) …
WEAK_SECRET = 16
#: … and shorter than this, warned of: SHA-256's output size, what RFC 2104 recommends.
STRONG_SECRET = 32
ALLOW_WEAK_SECRET = Setting(
    "--allow-weak-secret",
    "SYNAPSE_ALLOW_WEAK_SECRET",
    "allow_weak_secret",
    parse_bool,
    help=f"accept a secret shorter than {WEAK_SECRET} bytes (refused by default; below "
    f"{STRONG_SECRET} bytes only warned of)",
)
# --- output --------------------------------------------------------------------------------------
VERBOSE = Setting("--verbose", "SYNAPSE_VERBOSE", "verbose", parse_bool)
LOG_JSON = Setting(
    "--log-json",
    "SYNAPSE_LOG_JSON",
    "log_json",
    parse_bool,
    help="log JSON lines on stderr instead of console lines",
)
LOG_LEVEL = Setting("--log-level", "SYNAPSE_LOG_LEVEL", "log_level", parse_log_level)
# --- serve: the runtime (these live in the file's [p2p] table) ----------------------------------
RETAIN = Setting(
    "--retain",
    "SYNAPSE_RETAIN",
    None,
    parse_duration,
    help=(
        "how long finished tasks, their history and dead letters are kept: 30s, 15m, 12h, 7d or "
        "seconds (default 7d; [p2p] retain)"
    ),
    metavar="DURATION",
)
DRAIN_TIMEOUT = Setting(
    "--drain-timeout",
    "SYNAPSE_DRAIN_TIMEOUT",
    None,
    parse_duration,
    help=(
        "on SIGTERM/SIGINT, how long running tasks may take to finish before they fail with 'agent "
        "shutting down' (default 30s; [p2p] drain_timeout)"
    ),
    metavar="DURATION",
)
LEASE_TTL = Setting(
    "--lease-ttl",
    "SYNAPSE_LEASE_TTL",
    None,
    parse_duration,
    help=(
        "replicas on one PostgreSQL --store: how soon a dead replica's tasks are taken over "
        "(default 10s; [p2p] lease_ttl)"
    ),
    metavar="DURATION",
)
RATE_LIMIT = Setting(
    "--rate-limit",
    "SYNAPSE_RATE_LIMIT",
    None,
    parse_positive,
    help=(
        "requests per second accepted from one partner, beyond which it gets 429 with Retry-After "
        "(default: no limit; [p2p] rate_limit)"
    ),
    metavar="PER_SECOND",
)
MAX_TASKS_PER_PARTNER = Setting(
    "--max-tasks-per-partner",
    "SYNAPSE_MAX_TASKS_PER_PARTNER",
    None,
    parse_count,
    help=(
        "executor tasks in flight one partner may hold, so that one partner cannot take all of the "
        "capacity (default: no share; [p2p] max_tasks_per_partner)"
    ),
    metavar="N",
)
# --- serve: operations ---------------------------------------------------------------------------
CONSOLE = Setting("--console", "SYNAPSE_CONSOLE", "console", parse_bool)
CONSOLE_TOKENS = Setting(
    "--console-token",
    "SYNAPSE_CONSOLE_TOKENS",
    "console_tokens",
    parse_a2a_token,
    repeatable=True,
    help=(
        "a sign-in token of the console and the reviewer it names (decided_by); repeatable; none: "
        "a random one, logged at start-up"
    ),
    metavar="TOKEN[=REVIEWER]",
)
OTEL = Setting(
    "--otel",
    "SYNAPSE_OTEL",
    "otel",
    parse_bool,
    help=(
        "OpenTelemetry spans to the process's tracer provider (needs the otel extra; configure the "
        "exporter as OpenTelemetry says, e.g. opentelemetry-instrument)"
    ),
)
# --- serve: A2A ----------------------------------------------------------------------------------
A2A = Setting(
    "--a2a",
    "SYNAPSE_A2A",
    "a2a",
    parse_bool,
    help=(
        "also speak Linux Foundation A2A v1.0: GET /.well-known/agent-card.json and JSON-RPC at "
        "POST /a2a"
    ),
)
A2A_PUSH_ALLOW = Setting(
    "--a2a-push-allow",
    "SYNAPSE_A2A_PUSH_ALLOW",
    "a2a_push_allow",
    parse_push_prefix,
    repeatable=True,
    help=(
        "a URL prefix push notifications may go to, signed with --secret; repeatable; none: push "
        "notifications off"
    ),
    metavar="URL_PREFIX",
)
A2A_TOKENS = Setting(
    "--a2a-token",
    "SYNAPSE_A2A_TOKENS",
    "a2a_tokens",
    parse_a2a_token,
    repeatable=True,
    help=(
        "a bearer token A2A clients must present, and the name of whom it identifies; repeatable; "
        "none: no authentication"
    ),
    metavar="TOKEN[=NAME]",
)
A2A_PUSH_DISABLE_AFTER = Setting(
    "--a2a-push-disable-after",
    "SYNAPSE_A2A_PUSH_DISABLE_AFTER",
    "a2a_push_disable_after",
    parse_positive_count,
    help=(
        "disable a push configuration whose last N delivery attempts failed (its later "
        "notifications are dropped until it is created again; default: never)"
    ),
    metavar="N",
)
A2A_V03_CARD = Setting(
    "--a2a-v03-card",
    "SYNAPSE_A2A_V03_CARD",
    "a2a_v03_card",
    parse_bool,
    help=(
        "also put the A2A 0.3 members on the card at /.well-known/agent-card.json, for 0.3 clients "
        "that look only there (strict A2A 1.0 validators refuse it; the 0.3 card is at "
        "/.well-known/agent.json either way)"
    ),
)
A2A_EXTENSIONS = Setting(
    "--a2a-extension",
    "SYNAPSE_A2A_EXTENSIONS",
    "a2a_extensions",
    parse_extension_uri,
    repeatable=True,
    help=(
        "an A2A extension this agent supports, declared on its card and activated for calls "
        "that name it in A2A-Extensions; repeatable; the A2A samples' timestamp extension "
        "(https://github.com/a2aproject/a2a-samples/extensions/timestamp/v1) stamps what tasks emit"
    ),
    metavar="URI",
)
A2A_REQUIRED_EXTENSIONS = Setting(
    "--a2a-required-extension",
    "SYNAPSE_A2A_REQUIRED_EXTENSIONS",
    "a2a_required_extensions",
    parse_extension_uri,
    repeatable=True,
    help=(
        "an A2A extension every call must name in A2A-Extensions (else it is refused, -32008); "
        "declared on the card as required; repeatable"
    ),
    metavar="URI",
)
A2A_TENANTS = Setting(
    "--a2a-tenant",
    "SYNAPSE_A2A_TENANTS",
    "a2a_tenants",
    parse_a2a_tenant,
    repeatable=True,
    help=(
        "a tenant the principal NAME may name (A2A requests' tenant); repeatable; none: any tenant "
        "is a namespace of the caller's own"
    ),
    metavar="NAME=TENANT",
)
A2A_TOKEN_FILE = Setting(
    "--a2a-token-file",
    "SYNAPSE_A2A_TOKEN_FILE",
    "a2a_token_file",
    str,
    help=(
        "bearer tokens A2A clients may present, one TOKEN[=NAME] a line ($SYNAPSE_A2A_TOKEN_FILE); "
        "more schemes: [a2a_security] in --config"
    ),
    metavar="PATH",
)
A2A_DEFAULT_TASK_TYPE = Setting(
    "--a2a-default-task-type",
    "SYNAPSE_A2A_DEFAULT_TASK_TYPE",
    "a2a_default_task_type",
    str,
    help=(
        "the task type of a message without metadata.taskType (default echo; '' refuses such "
        "messages)"
    ),
    metavar="TYPE",
)
A2A_PUBLIC_URL = Setting(
    "--a2a-public-url",
    "SYNAPSE_A2A_PUBLIC_URL",
    "a2a_public_url",
    parse_url,
    help="the base URL A2A clients reach us at, for the card (default: the origin of --endpoint)",
    metavar="URL",
)
A2A_BINDINGS = Setting(
    "--a2a-bindings",
    "SYNAPSE_A2A_BINDINGS",
    "a2a_bindings",
    parse_a2a_bindings,
    help=(
        "the A2A bindings to serve, comma-separated, in the order the card lists them (the order "
        "clients should prefer): JSONRPC, HTTP+JSON (or REST), GRPC (default JSONRPC,HTTP+JSON, "
        "and GRPC with --a2a-grpc-port)"
    ),
    metavar="LIST",
)
A2A_GRPC_PORT = Setting(
    "--a2a-grpc-port",
    "SYNAPSE_A2A_GRPC_PORT",
    "a2a_grpc_port",
    parse_port,
    help=(
        "also serve the A2A gRPC binding on this port of --host (0: any free port; needs the grpc "
        "extra)"
    ),
    metavar="PORT",
)
A2A_GRPC_PUBLIC_ADDRESS = Setting(
    "--a2a-grpc-public-address",
    "SYNAPSE_A2A_GRPC_PUBLIC_ADDRESS",
    "a2a_grpc_public_address",
    str,
    help=(
        "the gRPC address the card gives (default: the host of --a2a-public-url or of --endpoint, "
        "and the gRPC port)"
    ),
    metavar="HOST:PORT",
)
A2A_CARD_SIGNING_KEY = Setting(
    "--a2a-card-signing-key",
    "SYNAPSE_A2A_CARD_SIGNING_KEY",
    "a2a_card_signing_key",
    str,
    help="sign the agent card with this private key (PEM or JWK)",
    metavar="PATH",
)
A2A_CARD_SIGNING_KID = Setting(
    "--a2a-card-signing-kid",
    "SYNAPSE_A2A_CARD_SIGNING_KID",
    "a2a_card_signing_kid",
    str,
    help="the key id of the card signatures (default: the key's thumbprint)",
    metavar="KID",
)
# --- send to an A2A agent ------------------------------------------------------------------------
A2A_TOKEN = Setting(
    "--a2a-token",
    "SYNAPSE_A2A_TOKEN",
    "a2a_token",
    str,
    help="the bearer token the A2A agent expects",
    metavar="TOKEN",
)
A2A_BINDING = Setting(
    "--a2a-binding",
    "SYNAPSE_A2A_BINDING",
    "a2a_binding",
    parse_a2a_binding,
    help=(
        "use only this A2A binding (JSONRPC, HTTP+JSON or REST, GRPC); default: the first of the "
        "agent card's interfaces this client speaks"
    ),
    metavar="NAME",
)
A2A_OAUTH_CLIENT = Setting(
    "--a2a-oauth-client",
    "SYNAPSE_A2A_OAUTH_CLIENT",
    "a2a_oauth_client",
    str,
    help="get OAuth 2.0 / OpenID Connect tokens with this client id (client-credentials grant)",
    metavar="CLIENT_ID",
)
A2A_OAUTH_SECRET_FILE = Setting(
    "--a2a-oauth-secret-file",
    "SYNAPSE_A2A_OAUTH_SECRET_FILE",
    "a2a_oauth_secret_file",
    str,
    help="file holding the client secret",
    metavar="PATH",
)
A2A_API_KEY_FILE = Setting(
    "--a2a-api-key-file",
    "SYNAPSE_A2A_API_KEY_FILE",
    "a2a_api_key_file",
    str,
    help="file holding the API key, sent where the card says",
    metavar="PATH",
)
A2A_BASIC_FILE = Setting(
    "--a2a-basic-file",
    "SYNAPSE_A2A_BASIC_FILE",
    "a2a_basic_file",
    str,
    help="file holding USER:PASSWORD for HTTP Basic",
    metavar="PATH",
)
A2A_CARD_JWKS = Setting(
    "--a2a-card-jwks",
    "SYNAPSE_A2A_CARD_JWKS",
    "a2a_card_jwks",
    str,
    help="a JWKS URL whose keys may sign the agent card",
    metavar="URL",
)
A2A_REQUIRE_SIGNED_CARD = Setting(
    "--a2a-require-signed-card",
    "SYNAPSE_A2A_REQUIRE_SIGNED_CARD",
    "a2a_require_signed_card",
    parse_bool,
    help="refuse an agent whose card is unsigned or badly signed",
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

MCP_HTTP = Setting(
    "--http",
    "SYNAPSE_MCP_HTTP",
    "mcp_http",
    parse_listen,
    help="serve streamable HTTP at http://HOST:PORT/mcp instead of stdio",
    metavar="HOST:PORT",
)
MCP_TOKENS = Setting(
    "--mcp-token",
    "SYNAPSE_MCP_TOKENS",
    "mcp_tokens",
    parse_a2a_token,
    repeatable=True,
    help="a bearer token --http accepts; repeatable",
    metavar="TOKEN[=NAME]",
)
MCP_OAUTH_ISSUER = Setting(
    "--mcp-oauth-issuer",
    "SYNAPSE_MCP_OAUTH_ISSUER",
    "mcp_oauth_issuer",
    parse_http_url,
    help="accept OAuth 2.0 access tokens (JWTs) of this issuer",
    metavar="URL",
)
MCP_OAUTH_JWKS = Setting(
    "--mcp-oauth-jwks",
    "SYNAPSE_MCP_OAUTH_JWKS",
    "mcp_oauth_jwks",
    parse_http_url,
    help="the issuer's signing keys (JWKS)",
    metavar="URL",
)
MCP_OAUTH_AUDIENCE = Setting(
    "--mcp-oauth-audience",
    "SYNAPSE_MCP_OAUTH_AUDIENCE",
    "mcp_oauth_audience",
    str,
    help="the audience the tokens must name (default: the public URL)",
    metavar="AUDIENCE",
)
MCP_ALLOW_ANONYMOUS = Setting(
    "--mcp-allow-anonymous",
    "SYNAPSE_MCP_ALLOW_ANONYMOUS",
    "mcp_allow_anonymous",
    parse_bool,
    help=(
        "serve --http beyond loopback with no --mcp-token or issuer: every caller sees and answers "
        "every task"
    ),
)
MCP_PUBLIC_URL = Setting(
    "--mcp-public-url",
    "SYNAPSE_MCP_PUBLIC_URL",
    "mcp_public_url",
    parse_url,
    help="the MCP URL as clients reach it (default http://HOST:PORT/mcp)",
    metavar="URL",
)
MCP_A2A_AGENTS = Setting(
    "--a2a-agent",
    "SYNAPSE_MCP_A2A_AGENTS",
    "mcp_a2a_agents",
    str,
    repeatable=True,
    help="an A2A agent to delegate to (NAME: default its card's name)",
    metavar="[NAME=]URL",
)
MCP_WAIT = Setting(
    "--wait",
    "SYNAPSE_MCP_WAIT",
    "mcp_wait",
    parse_duration,
    help="how long a tool call waits for a task before returning its id (default 20s)",
    metavar="DURATION",
)
#: serve: offer an MCP server's tools as task types (`McpToolsHandler`).
HANDLER_MCP = Setting(
    "--handler-mcp",
    "SYNAPSE_HANDLER_MCP",
    "handler_mcp",
    str,
    help=(
        "offer the tools of this MCP server as task types instead of a --handler: a command line "
        "started over stdio, or a streamable HTTP URL (the `mcp` extra)"
    ),
    metavar="COMMAND|URL",
)

SETTINGS: tuple[Setting[Any], ...] = tuple(
    value for value in list(globals().values()) if isinstance(value, Setting)
)

#: Keys of the file that are tables rather than settings: partners, `P2PConfig` fields, the
#: HTTP server's limits, the A2A security schemes.
TABLE_KEYS = frozenset({"peer", "p2p", "http", "a2a_security"})
#: Top-level keys a config file may hold (a typo is an error, not a silently ignored key).
CONFIG_KEYS = frozenset(s.key for s in SETTINGS if s.key is not None) | TABLE_KEYS
