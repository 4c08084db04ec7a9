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

- **revocation**: `crl` (PEM, one or more CRLs) is checked for the leaf certificate on both
  sides (`VERIFY_CRL_CHECK_LEAF`): client certificates on the server side, server
  certificates on the client side. OpenSSL then fails closed: a leaf whose issuer has no CRL
  in the file is refused too, so the file needs a CRL of every CA whose leaves are checked.
  The file is read when a context is made (at start), and again into every context made
  from it when it changes (`reload_crls`; a peer calls it every `CRL_REFRESH` seconds), so a
  CRL renewed before its `nextUpdate` needs no restart. `RevocationList` is the same check
  for certificates no `ssl` context sees (gRPC's TLS is not Python's).

Minimum version TLS 1.2 on both sides; Python's defaults choose the ciphers.
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import os
import ssl
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from synapse._distribution import install
from synapse.logs import get_logger

log = get_logger("synapse.transport.tls")

#: Seconds between two looks at the CRL files (`refresh_crls`).
CRL_REFRESH = 60.0
#: Each context that checks a CRL file → (the file, its modification time when loaded).
_CRL_CONTEXTS: weakref.WeakKeyDictionary[ssl.SSLContext, tuple[str, float | None]] = (
    weakref.WeakKeyDictionary()
)
_REVOCATION_LISTS: weakref.WeakSet[RevocationList] = weakref.WeakSet()


def _mtime(path: str | Path) -> float | None:
    try:
        return os.stat(path).st_mtime_ns / 1e9
    except OSError:
        return None


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
    #: Certificate revocation lists (PEM) checked for the peer's leaf certificate, both ways.
    crl: str | Path | None = None

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
            self._load_crl(context)
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
        self._load_crl(context)
        return context

    def _load_crl(self, context: ssl.SSLContext) -> None:
        if self.crl is None:
            return
        _load_ca(context, self.crl, "--tls-crl")
        context.verify_flags |= ssl.VERIFY_CRL_CHECK_LEAF
        _CRL_CONTEXTS[context] = (str(self.crl), _mtime(self.crl))

    def revocation_list(self) -> RevocationList | None:
        """The CRLs of `crl`, each verified against our CAs (`client_ca`, `ca`); None when
        no CRL is set."""
        if self.crl is None:
            return None
        cas = [ca for ca in (self.client_ca, self.ca) if ca is not None]
        if not cas:
            raise ValueError("--tls-crl needs the CA that signed it (--tls-client-ca, --tls-ca)")
        return RevocationList(self.crl, *cas)


class RevocationList:
    """CRLs (PEM) for certificates that no Python `ssl` context verifies (gRPC's TLS).

    Each CRL's signature is checked against the CA certificates of `ca_files` when loaded (a
    CRL nobody we trust signed is refused at start); of two CRLs of one issuer the later one
    counts. `why_revoked(cert)` then answers as OpenSSL's `VERIFY_CRL_CHECK_LEAF` does:
    revoked, no CRL of the certificate's issuer, or that CRL past its `nextUpdate` are all
    refusals.
    """

    def __init__(self, crl_file: str | Path, *ca_files: str | Path) -> None:
        if not ca_files:
            raise ValueError("a revocation list needs the CAs that sign its CRLs")
        self.crl_file, self.ca_files = crl_file, ca_files
        self._mtime = _mtime(crl_file)
        self._crls: dict[bytes, Any] = self._load()
        _REVOCATION_LISTS.add(self)

    def reload(self) -> bool:
        """Read the file again if it changed; True if it did (a bad new file keeps the old)."""
        mtime = _mtime(self.crl_file)
        if mtime is None or mtime == self._mtime:
            return False
        self._mtime = mtime
        self._crls = self._load()
        return True

    def _load(self) -> dict[bytes, Any]:
        try:
            from cryptography import x509
        except ImportError as exc:  # pragma: no cover - depends on the installation
            raise ValueError(
                f"checking CRLs needs the cryptography package: {install('security')}"
            ) from exc

        crl_file = self.crl_file
        try:
            crl_pem = Path(crl_file).read_bytes()
            cas = [
                ca
                for ca_file in self.ca_files
                for ca in x509.load_pem_x509_certificates(Path(ca_file).read_bytes())
            ]
        except OSError as exc:
            raise ValueError(f"cannot read --tls-crl {crl_file}: {exc}") from exc
        crls: dict[bytes, Any] = {}
        blocks = [b for b in crl_pem.split(b"-----END X509 CRL-----") if b"BEGIN X509 CRL" in b]
        if not blocks:
            raise ValueError(f"--tls-crl {crl_file} holds no PEM CRL")
        for block in blocks:
            try:
                crl = x509.load_pem_x509_crl(block + b"-----END X509 CRL-----\n")
            except ValueError as exc:
                raise ValueError(f"--tls-crl {crl_file}: {exc}") from exc
            signer = next(
                (
                    ca
                    for ca in cas
                    if ca.subject == crl.issuer and crl.is_signature_valid(ca.public_key())  # type: ignore[arg-type]
                ),
                None,
            )
            if signer is None:
                raise ValueError(
                    f"--tls-crl {crl_file}: a CRL of {crl.issuer.rfc4514_string()} is not "
                    f"signed by a CA of {', '.join(map(str, self.ca_files))}"
                )
            known = crls.get(crl.issuer.public_bytes())
            if known is None or known.last_update_utc < crl.last_update_utc:
                crls[crl.issuer.public_bytes()] = crl
        return crls

    def why_revoked(self, cert_pem: bytes) -> str | None:
        """Why the certificate must be refused, or None."""
        cert = _parsed(cert_pem)
        crl = self._crls.get(cert.issuer.public_bytes())
        if crl is None:
            return f"no CRL of the certificate's issuer {cert.issuer.rfc4514_string()}"
        next_update = crl.next_update_utc
        if next_update is not None and next_update < datetime.datetime.now(datetime.UTC):
            return "the CRL of the certificate's issuer has expired"
        if crl.get_revoked_certificate_by_serial_number(cert.serial_number) is not None:
            return "the certificate is revoked"
        return None


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


def reload_crls() -> int:
    """Load each CRL file that changed since it was loaded into every context (and every
    `RevocationList`) that checks it; the number of reloads. A newer CRL of an issuer takes
    over from the older one (OpenSSL uses the latest valid CRL of an issuer). A file that
    cannot be read or parsed now keeps what was loaded, and is logged."""
    reloaded = 0
    for context, (path, loaded) in list(_CRL_CONTEXTS.items()):
        mtime = _mtime(path)
        if mtime is None or mtime == loaded:
            continue
        _CRL_CONTEXTS[context] = (path, mtime)
        try:
            context.load_verify_locations(cafile=path)
        except (OSError, ssl.SSLError) as exc:
            log.warning("crl_reload_failed", path=path, error=str(exc))
            continue
        reloaded += 1
    for revocations in list(_REVOCATION_LISTS):
        try:
            reloaded += revocations.reload()
        except ValueError as exc:
            log.warning("crl_reload_failed", path=str(revocations.crl_file), error=str(exc))
    if reloaded:
        log.info("crl_reloaded", contexts=reloaded)
    return reloaded


async def refresh_crls(interval: float = CRL_REFRESH) -> None:
    """`reload_crls` every `interval` seconds, until cancelled (a peer with `crl` runs it)."""
    while True:
        await asyncio.sleep(interval)
        reload_crls()


_NAME_KEYS = {
    "2.5.4.3": "commonName",
    "2.5.4.6": "countryName",
    "2.5.4.7": "localityName",
    "2.5.4.8": "stateOrProvinceName",
    "2.5.4.10": "organizationName",
    "2.5.4.11": "organizationalUnitName",
    "1.2.840.113549.1.9.1": "emailAddress",
}


def pem_certificate_dict(pem: bytes) -> dict[str, Any] | None:
    """A PEM certificate in the `ssl.getpeercert()` form (subject, subjectAltName, serial),
    for connections whose TLS is not Python's (gRPC gives the verified certificate as PEM)."""
    found = _certificate_dict(pem)
    return dict(found) if found is not None else None


@functools.lru_cache(maxsize=256)
def _parsed(pem: bytes) -> Any:
    """The certificate of `pem` (parsed once: a client shows the same one on every call)."""
    from cryptography import x509

    return x509.load_pem_x509_certificate(pem)


@functools.lru_cache(maxsize=256)
def _certificate_dict(pem: bytes) -> dict[str, Any] | None:
    from cryptography import x509

    try:
        cert = _parsed(pem)
    except ValueError:
        return None
    subject = tuple(
        tuple((_NAME_KEYS.get(a.oid.dotted_string, a.oid.dotted_string), str(a.value)) for a in rdn)
        for rdn in cert.subject.rdns
    )
    alt: list[tuple[str, str]] = []
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        san = None
    if san is not None:
        alt += [("DNS", v) for v in san.get_values_for_type(x509.DNSName)]
        alt += [("URI", v) for v in san.get_values_for_type(x509.UniformResourceIdentifier)]
        alt += [("email", v) for v in san.get_values_for_type(x509.RFC822Name)]
        alt += [("IP Address", str(v)) for v in san.get_values_for_type(x509.IPAddress)]
    return {
        "subject": subject,
        "subjectAltName": tuple(alt),
        "serialNumber": format(cert.serial_number, "X"),
    }


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
    "RevocationList",
    "TLSConfig",
    "certificate_identities",
    "certificate_names_agent",
    "check_partner_certificate",
    "map_principal",
    "peer_certificate",
    "pem_certificate_dict",
    "refresh_crls",
    "reload_crls",
]
