"""The command line's security settings: TLS files, secrets kept off the command line, the
shared-secret switch, and the A2A security schemes of `serve --a2a` (docs/security.md).

Each setting has a flag, a `SYNAPSE_…` variable and a config-file key, like every other one
(`synapse.cli.settings`). Secrets are best given as files (`--secret-file`,
`--peer-secret-file`, `--a2a-token-file`, `--tls-key-password-file`) or environment
variables: `ps` shows every process's command line to every user of the machine.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from synapse.cli.errors import CliError
from synapse.cli.options import (
    A2A_API_KEY_FILE,
    A2A_BASIC_FILE,
    A2A_CARD_JWKS,
    A2A_CARD_SIGNING_KEY,
    A2A_CARD_SIGNING_KID,
    A2A_OAUTH_CLIENT,
    A2A_OAUTH_SECRET_FILE,
    A2A_REQUIRE_SIGNED_CARD,
    A2A_TOKEN_FILE,
    ALLOW_SHARED_SECRET,
    ALLOW_WEAK_SECRET,
    SECRET_FILE,
    STRONG_SECRET,
    TLS_CA,
    TLS_CERT,
    TLS_CLIENT_CA,
    TLS_CLIENT_CERT,
    TLS_CLIENT_KEY,
    TLS_CRL,
    TLS_KEY,
    TLS_KEY_PASSWORD_FILE,
    WEAK_SECRET,
    Setting,
    add_setting,
)
from synapse.types.errors import unknown_key

if TYPE_CHECKING:
    from synapse.transport.tls import TLSConfig

T = TypeVar("T")


class _SettingsView(Protocol):
    """What this module reads of `synapse.cli.settings.Settings` (which imports this one)."""

    args: argparse.Namespace
    env: Mapping[str, str]

    @property
    def config(self) -> Any: ...

    def get(self, setting: Setting[T], default: T | None = None) -> T | None: ...

    def switch(self, setting: Setting[bool]) -> bool: ...


#: Extra keys of a `[[peer]]` table.
PEER_SECURITY_KEYS = frozenset({"secret_env"})

#: The TLS files, with their help: each a row of `synapse.cli.options`.
TLS_FLAGS: tuple[tuple[Setting[str], str], ...] = (
    (TLS_CERT, "our certificate (PEM chain)"),
    (TLS_KEY, "its private key (PEM)"),
    (
        TLS_CLIENT_CA,
        "require client certificates issued by this CA (mTLS); a partner's certificate must "
        "name its agent id",
    ),
    (TLS_CA, "verify the servers we call against this CA instead of the system's"),
    (
        TLS_CLIENT_CERT,
        "the certificate we present to servers that ask (default: --tls-cert when "
        "--tls-client-ca is set)",
    ),
    (TLS_CLIENT_KEY, "its private key"),
    (TLS_KEY_PASSWORD_FILE, "file holding the password of encrypted keys"),
    (
        TLS_CRL,
        "certificate revocation lists (PEM) checked for client certificates we are shown and "
        "server certificates we call; a CRL of every CA issuing them is needed",
    ),
)


def add_tls_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("TLS (docs/security.md in the Synapse repository)")
    for setting, text in TLS_FLAGS:
        group.add_argument(
            setting.flag, dest=setting.dest, metavar="PATH", help=setting.described(text)
        )


def add_secret_flags(group: argparse._ArgumentGroup, *, serve: bool) -> None:
    """`--secret-file`, `--peer-secret-env` (and, for serve, `--allow-shared-secret`)."""
    add_setting(group, SECRET_FILE)
    group.add_argument(
        "--peer-secret-env",
        action="append",
        metavar="PARTNER_ID=VAR",
        help="that partner's secrets from environment variable VAR (comma-separated, newest "
        "first); repeatable",
    )
    add_setting(group, ALLOW_WEAK_SECRET)
    if serve:
        add_setting(group, ALLOW_SHARED_SECRET)


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


def secret_from_file(s: _SettingsView) -> str | None:
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


def peer_secret_envs(s: _SettingsView) -> dict[str, str]:
    """`--peer-secret-env ID=VAR` flags: partner → environment variable."""
    found: dict[str, str] = {}
    for item in getattr(s.args, "peer_secret_env", None) or ():
        agent_id, sep, variable = item.partition("=")
        if not sep or not agent_id.strip() or not variable.strip():
            raise CliError(f"bad --peer-secret-env: expected PARTNER_ID=VAR, got {item!r}")
        found[agent_id.strip()] = variable.strip()
    return found


def secret_strength(partner: str, secrets: Iterable[str], allow_weak: bool) -> str | None:
    """Refuse a secret too short to sign with (`CliError`); a warning for a short one."""
    shortest = min(len(secret.encode()) for secret in secrets)
    if shortest >= STRONG_SECRET:
        return None
    advice = "generate one with `openssl rand -hex 32`"
    if shortest < WEAK_SECRET and not allow_weak:
        raise CliError(
            f"the secret shared with partner {partner!r} is {_bytes(shortest)} long: an "
            f"HMAC-SHA256 secret needs at least {WEAK_SECRET} ({STRONG_SECRET} recommended); "
            f"{advice}, or accept it with --allow-weak-secret"
        )
    return (
        f"the secret shared with partner {partner!r} is {_bytes(shortest)} long, under the "
        f"{STRONG_SECRET} recommended for HMAC-SHA256; {advice}"
    )


def _bytes(count: int) -> str:
    return "1 byte" if count == 1 else f"{count} bytes"


def allow_shared_secret(s: _SettingsView) -> bool:
    return s.switch(ALLOW_SHARED_SECRET)


def secrets_on_command_line(args: argparse.Namespace) -> list[str]:
    """The flags of this run that carried a secret itself (visible to `ps`)."""
    shown = []
    if getattr(args, "secret", None):
        shown.append("--secret")
    if getattr(args, "a2a_token", None):
        shown.append("--a2a-token")
    return shown


def tls_config(s: _SettingsView, *, serving: bool) -> TLSConfig | None:
    """The `TLSConfig` of the TLS settings, or None when none is set."""
    from synapse.transport.tls import TLSConfig

    values: dict[str, str] = {}
    for setting, _text in TLS_FLAGS:
        value = s.get(setting)
        if value:
            values[setting.dest] = value
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
            crl=values.get("tls_crl"),
        )
        # Load the files now: a bad path or key is one line at start, not a failure later.
        config.server_context()
        config.client_context()
        if config.crl is not None:
            # The CRLs are checked by us where Python's ssl is not used (gRPC): each one
            # must be signed by a CA we trust.
            config.revocation_list()
    except ValueError as exc:
        raise CliError(f"bad TLS settings: {exc}") from exc
    return config


__all__ = [
    "PEER_SECURITY_KEYS",
    "add_secret_flags",
    "add_tls_flags",
    "allow_shared_secret",
    "peer_secret_envs",
    "secret_from_file",
    "secrets_from_env",
    "secrets_on_command_line",
    "tls_config",
]


# --- A2A: the schemes `serve --a2a` enforces, the card it signs ------------------------------


def add_a2a_serve_flags(group: argparse._ArgumentGroup) -> None:
    add_setting(group, A2A_TOKEN_FILE)
    add_setting(group, A2A_CARD_SIGNING_KEY)
    add_setting(group, A2A_CARD_SIGNING_KID)


def a2a_token_file(s: _SettingsView, parse: Callable[[str], tuple[str, str]]) -> dict[str, str]:
    """Tokens of `--a2a-token-file` (TOKEN[=NAME] a line, each `parse`d)."""
    path = s.get(A2A_TOKEN_FILE)
    if path is None:
        return {}
    lines = _lines(Path(path), "A2A token file")
    try:
        return dict(parse(line) for line in lines)
    except ValueError as exc:
        raise CliError(f"A2A token file {path}: {exc}") from exc


def _lines(path: Path, what: str) -> list[str]:
    try:
        text = path.expanduser().read_text(encoding="utf-8")
    except OSError as exc:
        raise CliError(f"cannot read {what} {path}: {exc.strerror}") from exc
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


def card_signer(s: _SettingsView) -> Any:
    """The `CardSigner` of `--a2a-card-signing-key`, or None."""
    path = s.get(A2A_CARD_SIGNING_KEY)
    if path is None:
        return None
    kid = s.get(A2A_CARD_SIGNING_KID)
    from synapse.a2a.card_signing import CardSigner, load_key

    try:
        return CardSigner(load_key(path, kid=kid))
    except (OSError, ValueError) as exc:
        raise CliError(f"bad --a2a-card-signing-key {path}: {exc}") from exc


def a2a_policy(s: _SettingsView, tokens: Mapping[str, str]) -> Any:
    """The `SecurityPolicy` of `[a2a_security]` (and of bearer `tokens`), or None.

    [a2a_security]
    require = [["oauth"], ["key"]]          # alternatives; default: any scheme alone
    [a2a_security.schemes.key]
    type = "apiKey"                         # apiKey, bearer, basic, oauth2, openIdConnect, mtls
    location = "header"                     # header, query, cookie
    name = "X-API-Key"
    keys_file = "api-keys"                  # KEY=NAME a line
    [a2a_security.schemes.oauth]
    type = "oauth2"
    issuer = "https://issuer.example"
    audience = "https://agent.example/a2a"
    jwks_url = "https://issuer.example/jwks"
    token_url = "https://issuer.example/token"
    scopes = { "tasks:slow" = "start slow tasks" }
    [a2a_security.skills]
    slow = [{ oauth = ["tasks:slow"] }]
    [a2a_security.methods]
    CancelTask = ["tasks:cancel"]
    """
    from synapse.a2a.server.security import HttpBearerScheme, SecurityPolicy

    raw = s.config.values.get("a2a_security")
    if raw is None:
        return SecurityPolicy.bearer_tokens(tokens) if tokens else None
    where = f"config file {s.config.path}: [a2a_security]"
    if not isinstance(raw, dict):
        raise CliError(f"{where} must be a table")
    known = {"require", "schemes", "skills", "methods"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise CliError(unknown_key(where, unknown[0], known))
    base = s.config.path.parent if s.config.path is not None else Path()
    # The issuer's JWKS and discovery document are fetched as our other calls are: verified
    # against --tls-ca (a private issuer), presenting our client certificate.
    tls = tls_config(s, serving=False)
    ssl: Any = tls.client_context() if tls is not None and tls.ca is not None else True
    schemes: dict[str, Any] = {}
    for name, spec in (raw.get("schemes") or {}).items():
        if not isinstance(spec, dict):
            raise CliError(f"{where}.schemes.{name} must be a table")
        try:
            schemes[name] = _scheme(spec, base, ssl)
        except (KeyError, TypeError, ValueError) as exc:
            raise CliError(f"{where}.schemes.{name}: {exc}") from exc
    if tokens:
        schemes.setdefault("bearer", HttpBearerScheme(tokens))
    try:
        return SecurityPolicy(
            schemes,
            requirements=[
                {n: [] for n in alt} if isinstance(alt, list) else alt for alt in raw["require"]
            ]
            if "require" in raw
            else None,
            skill_requirements=raw.get("skills"),
            method_scopes=raw.get("methods"),
        )
    except (TypeError, ValueError, AttributeError) as exc:
        raise CliError(f"{where}: {exc}") from exc


def _pairs(path: Path, separator: str, what: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in _lines(path, what):
        left, sep, right = (
            line.rpartition(separator) if separator == "=" else line.partition(separator)
        )
        if not sep or not left or not right:
            raise ValueError(f"{what} {path}: expected a line LEFT{separator}RIGHT")
        found[left.strip()] = right.strip()
    return found


def _scheme(spec: Mapping[str, Any], base: Path, ssl: Any = True) -> Any:
    from synapse.a2a.server import security

    kind = spec["type"]
    if kind == "apiKey":
        keys = _pairs(base / spec["keys_file"], "=", "API key file")
        return security.ApiKeyScheme(
            keys, name=spec.get("name", "X-API-Key"), location=spec.get("location", "header")
        )
    if kind == "bearer":
        return security.HttpBearerScheme(_pairs(base / spec["tokens_file"], "=", "token file"))
    if kind == "basic":
        return security.HttpBasicScheme(_pairs(base / spec["users_file"], ":", "users file"))
    if kind == "oauth2":
        validator = security.JwtValidator(
            issuer=spec["issuer"],
            audience=spec["audience"],
            jwks=security.JwksSource(spec["jwks_url"], ssl=ssl),
            leeway=int(spec.get("leeway", 30)),
        )
        return security.OAuth2Scheme(
            validator, token_url=spec["token_url"], scopes=dict(spec.get("scopes", {}))
        )
    if kind == "openIdConnect":
        return security.OpenIdConnectScheme(
            spec["discovery_url"], audience=spec["audience"], ssl=ssl
        )
    if kind == "mtls":
        names = spec.get("names")
        return security.MutualTlsScheme(dict(names) if names is not None else None)
    raise ValueError(f"unknown type {kind!r} (apiKey, bearer, basic, oauth2, openIdConnect, mtls)")


# --- A2A: what `send --a2a-agent` presents, which cards it trusts ---------------------------------


def add_a2a_client_flags(group: argparse._ArgumentGroup) -> None:
    add_setting(group, A2A_OAUTH_CLIENT)
    add_setting(group, A2A_OAUTH_SECRET_FILE)
    add_setting(group, A2A_API_KEY_FILE)
    add_setting(group, A2A_BASIC_FILE)
    group.add_argument(
        "--a2a-card-key",
        action="append",
        metavar="PATH",
        help="a public key (PEM or JWK) the agent card must be signed with; repeatable",
    )
    add_setting(group, A2A_CARD_JWKS)
    add_setting(group, A2A_REQUIRE_SIGNED_CARD)


#: `send`'s A2A client flags: dest → flag (refused without `--a2a`).
A2A_CLIENT_FLAGS = {
    "a2a_oauth_client": "--a2a-oauth-client",
    "a2a_oauth_secret_file": "--a2a-oauth-secret-file",
    "a2a_api_key_file": "--a2a-api-key-file",
    "a2a_basic_file": "--a2a-basic-file",
    "a2a_card_key": "--a2a-card-key",
    "a2a_card_jwks": "--a2a-card-jwks",
    "a2a_require_signed_card": "--a2a-require-signed-card",
}


def a2a_client_options(s: _SettingsView) -> dict[str, Any]:
    """`A2AClient` keyword arguments: credentials, card verification, TLS."""
    from synapse.a2a.card_signing import CardVerifier, load_key
    from synapse.a2a.client.auth import ClientCredentials, OAuthClient

    options: dict[str, Any] = {}
    tls = tls_config(s, serving=False)
    ssl_context = tls.client_context() if tls is not None else None
    if ssl_context is not None:
        options["ssl"] = ssl_context
        options["tls"] = tls  # the gRPC binding reads the files
    oauth: OAuthClient | None = None
    client_id = s.get(A2A_OAUTH_CLIENT)
    if client_id:
        path = s.get(A2A_OAUTH_SECRET_FILE)
        if path is None:
            raise CliError("--a2a-oauth-client needs --a2a-oauth-secret-file")
        oauth = OAuthClient(client_id, read_first_line(Path(path), "OAuth client secret file"))
    api_key_file = s.get(A2A_API_KEY_FILE)
    basic_file = s.get(A2A_BASIC_FILE)
    basic: tuple[str, str] | None = None
    if basic_file:
        user, sep, password = read_first_line(Path(basic_file), "Basic credentials file").partition(
            ":"
        )
        if not sep:
            raise CliError(f"Basic credentials file {basic_file}: expected USER:PASSWORD")
        basic = (user, password)
    if oauth or api_key_file or basic or tls is not None:
        options["credentials"] = ClientCredentials(
            oauth=oauth,
            api_keys={"*": read_first_line(Path(api_key_file), "API key file")}
            if api_key_file
            else {},
            basic=basic,
            client_certificate=tls is not None and tls.client_cert is not None,
            ssl=ssl_context if ssl_context is not None else True,
        )
    keys = [load_key(p) for p in getattr(s.args, "a2a_card_key", None) or ()]
    jwks = s.get(A2A_CARD_JWKS)
    required = s.switch(A2A_REQUIRE_SIGNED_CARD)
    if keys or jwks:
        options["card_verifier"] = CardVerifier(
            keys=keys, jwks_url=jwks, ssl=options.get("ssl", True)
        )
    elif required:
        raise CliError("--a2a-require-signed-card needs --a2a-card-key or --a2a-card-jwks")
    options["require_signed_card"] = required
    return options
