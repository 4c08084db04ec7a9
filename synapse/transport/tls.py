"""TLS and mutual TLS for everything a peer serves and everything it calls.

`TLSConfig` holds file paths only (it is what `Peer(tls=...)`, the CLI and the TOML file
fill in); `server_context()` and `client_context()` build the `ssl.SSLContext`s:

- **server**: `cert` + `key` (PEM; the cert file may hold the chain). With `client_ca`,
  every client must present a certificate issued by that CA, or the handshake fails; the
  verified certificate's identities (`certificate_identities`) are then mapped to a
  principal (A2A's mTLS scheme) and, for Synapse partners, must name the partner's agent id
  (`check_partner_certificate`).
- **client**: servers are verified against the system store, or against `ca` (a private
  CA) when given; hostname checking stays on. `client_cert` + `client_key` are presented
  when a server asks for one.

Minimum version TLS 1.2 on both sides; Python's defaults choose the ciphers.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: A certificate's URI SAN naming a Synapse agent: `synapse:agent:<agent id>`.
AGENT_URI_PREFIX = "synapse:agent:"


@dataclass(frozen=True, slots=True, kw_only=True)
class TLSConfig:
    """Certificates and keys of one peer (paths to PEM files)."""

    #: Our certificate (chain) and key, served to clients; both or neither.
    cert: str | Path | None = None
    key: str | Path | None = None
    #: Require client certificates issued by this CA (bundle) on what we serve.
    client_ca: str | Path | None = None
    #: Verify the servers we call against this CA (bundle) instead of the system store.
    ca: str | Path | None = None
    #: The certificate (chain) and key we present when a server asks for one.
    client_cert: str | Path | None = None
    client_key: str | Path | None = None
    #: Password of encrypted keys, if any (read it from a file or the environment, not argv).
    key_password: str | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise ValueError("TLS needs both a certificate and its key (--tls-cert, --tls-key)")
        if (self.client_cert is None) != (self.client_key is None):
            raise ValueError("a client certificate needs its key (--tls-client-cert/-key)")
        if self.client_ca is not None and self.cert is None:
            raise ValueError("--tls-client-ca needs --tls-cert and --tls-key (TLS is off)")

    @property
    def serves_tls(self) -> bool:
        return self.cert is not None

    @property
    def requires_client_cert(self) -> bool:
        return self.client_ca is not None

    def server_context(self) -> ssl.SSLContext | None:
        """The context of our listening socket, or None when we serve plain HTTP."""
        if self.cert is None or self.key is None:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        _load_chain(context, self.cert, self.key, self.key_password, "--tls-cert/--tls-key")
        if self.client_ca is not None:
            _load_ca(context, self.client_ca, "--tls-client-ca")
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    def client_context(self) -> ssl.SSLContext:
        """The context of our outgoing connections (always verifying the server)."""
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.ca is not None:
            _load_ca(context, self.ca, "--tls-ca")
        if self.client_cert is not None and self.client_key is not None:
            _load_chain(
                context,
                self.client_cert,
                self.client_key,
                self.key_password,
                "--tls-client-cert/--tls-client-key",
            )
        return context


def _load_chain(
    context: ssl.SSLContext, cert: str | Path, key: str | Path, password: str | None, what: str
) -> None:
    try:
        context.load_cert_chain(str(cert), str(key), password=password)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"cannot load {what} ({cert}, {key}): {exc}") from exc


def _load_ca(context: ssl.SSLContext, ca: str | Path, what: str) -> None:
    try:
        context.load_verify_locations(cafile=str(ca))
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"cannot load {what} {ca}: {exc}") from exc


def peer_certificate(transport: Any) -> dict[str, Any] | None:
    """The verified client certificate of a connection (`ssl.getpeercert()` form), if any."""
    if transport is None:
        return None
    cert = transport.get_extra_info("peercert")
    return cert if isinstance(cert, dict) and cert else None


def certificate_identities(cert: Mapping[str, Any]) -> list[str]:
    """What a certificate says it is, most specific first.

    Agent URIs (`synapse:agent:<id>` SANs) as the bare agent id, then the other URI SANs,
    DNS SANs, e-mail SANs, then the subject's common names.
    """
    agents: list[str] = []
    others: list[str] = []
    for kind, value in cert.get("subjectAltName", ()):
        if kind == "URI" and value.startswith(AGENT_URI_PREFIX):
            agents.append(value[len(AGENT_URI_PREFIX) :])
        elif kind in ("URI", "DNS", "email"):
            others.append(value)
    common_names = [
        value for rdn in cert.get("subject", ()) for key, value in rdn if key == "commonName"
    ]
    return agents + others + common_names


def certificate_names_agent(cert: Mapping[str, Any], agent_id: str) -> bool:
    """True if `cert` identifies `agent_id`.

    A certificate with `synapse:agent:` URIs identifies exactly those agents; otherwise any
    of its DNS/URI SANs or common names equal to the agent id does.
    """
    identities = certificate_identities(cert)
    agent_uris = [
        value[len(AGENT_URI_PREFIX) :]
        for kind, value in cert.get("subjectAltName", ())
        if kind == "URI" and value.startswith(AGENT_URI_PREFIX)
    ]
    if agent_uris:
        return agent_id in agent_uris
    return agent_id in identities


def map_principal(cert: Mapping[str, Any], names: Mapping[str, str] | None = None) -> str | None:
    """The principal a verified certificate stands for.

    With `names` (certificate identity → principal), the first identity it lists; None if it
    lists none. Without, the certificate's first identity.
    """
    identities = certificate_identities(cert)
    if names is not None:
        for identity in identities:
            if identity in names:
                return names[identity]
        return None
    return identities[0] if identities else None


def check_partner_certificate(transport: Any, agent_id: str) -> str | None:
    """Why the connection's client certificate may not speak for `agent_id`, or None.

    No certificate on the connection (plain HTTP, or TLS without `client_ca`) is not a
    refusal here: requiring one is the TLS context's job.
    """
    cert = peer_certificate(transport)
    if cert is None:
        return None
    if certificate_names_agent(cert, agent_id):
        return None
    shown = certificate_identities(cert)
    return f"the client certificate ({', '.join(shown) or 'no identity'}) is not {agent_id!r}'s"


__all__ = [
    "AGENT_URI_PREFIX",
    "TLSConfig",
    "certificate_identities",
    "certificate_names_agent",
    "check_partner_certificate",
    "map_principal",
    "peer_certificate",
]
