"""TLS for the broker's listeners: one server SSLContext built from `[tls]`, reloadable in place.

RabbitMQ's `ssl_options` map onto Python's `ssl` as follows (docs/security.md, "TLS"):
`versions` sets the context's minimum and maximum version, `ciphers` its cipher list (TLS 1.2
and below; OpenSSL fixes the TLS 1.3 suites), `honor_cipher_order` the server-preference
option, `verify`/`fail_if_no_peer_cert` the certificate request mode. Every listener (AMQPS,
HTTPS management, HTTPS Prometheus) shares the one context, so `reload()` — from
`ctl reload_certificates` or SIGHUP — replaces the certificate for all of them: handshakes
after it present the new certificate, established sessions keep theirs.
"""

from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from amqp_server.config.settings import TLS_VERSIONS, TlsConfig

log = logging.getLogger(__name__)


def build_server_context(tls: "TlsConfig") -> ssl.SSLContext:
    """A server context for `tls`; raises OSError/ssl.SSLError if a file is missing or invalid."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    versions = sorted(TLS_VERSIONS[v] for v in tls.versions)
    if versions[0] < ssl.TLSVersion.TLSv1_2:
        # OpenSSL's default security level refuses TLS 1.0/1.1 even when asked for them.
        context.set_ciphers("DEFAULT:@SECLEVEL=0")
    context.minimum_version = versions[0]
    context.maximum_version = versions[-1]
    if tls.ciphers:
        context.set_ciphers(":".join(tls.ciphers))
    if tls.honor_cipher_order:
        context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    if tls.verify == "verify_peer":
        context.verify_mode = ssl.CERT_REQUIRED if tls.fail_if_no_peer_cert else ssl.CERT_OPTIONAL
    else:
        context.verify_mode = ssl.CERT_NONE
    if tls.cacertfile is not None:
        context.load_verify_locations(cafile=str(tls.cacertfile))
    context.load_cert_chain(str(tls.certfile), str(tls.keyfile), password=tls.password)
    return context


class TlsListenerContext:
    """The one SSLContext every TLS listener uses, and the certificate it presents."""

    def __init__(self, tls: "TlsConfig") -> None:
        self.settings = tls
        self.context = build_server_context(tls)

    def reload(self) -> None:
        """Read the certificate, key and CA files again. New handshakes use them; open
        connections are untouched. Raises (and keeps the old certificate) if a file is bad."""
        tls = self.settings
        # Check the new files on a scratch context first, so a bad file never half-replaces the old.
        build_server_context(tls)
        if tls.cacertfile is not None:
            self.context.load_verify_locations(cafile=str(tls.cacertfile))
        self.context.load_cert_chain(str(tls.certfile), str(tls.keyfile), password=tls.password)
        log.info("TLS certificate reloaded from %s", tls.certfile)

    def certificate_not_after(self) -> datetime:
        """When the listeners' certificate expires (UTC)."""
        # The ssl module reads a PEM certificate's fields only through this helper (no public API).
        decoded = ssl._ssl._test_decode_cert(str(self.settings.certfile))  # type: ignore[attr-defined]
        return datetime.fromtimestamp(ssl.cert_time_to_seconds(decoded["notAfter"]), timezone.utc)


@dataclass(frozen=True)
class TlsSession:
    """What RabbitMQ's connection info items say about a TLS connection."""

    protocol: str  # "tlsv1.3", RabbitMQ's spelling
    cipher: str
    key_exchange: str
    hash: str
    peer_cert: dict[str, Any] | None  # ssl.SSLObject.getpeercert() of a verified client certificate

    @property
    def peer_cert_subject(self) -> str | None:
        return _distinguished_name(self.peer_cert["subject"]) if self.peer_cert else None

    @property
    def peer_cert_issuer(self) -> str | None:
        return _distinguished_name(self.peer_cert["issuer"]) if self.peer_cert else None

    @property
    def peer_cert_validity(self) -> str | None:
        if not self.peer_cert:
            return None
        # RabbitMQ: "2026-11-25T08:00:00Z - 2027-11-25T08:00:00Z".
        bounds = (self.peer_cert["notBefore"], self.peer_cert["notAfter"])
        return " - ".join(
            datetime.fromtimestamp(ssl.cert_time_to_seconds(b), timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            for b in bounds
        )

    def login_name(self, source: str) -> str | None:
        """The user a client certificate names, as rabbitmq_auth_mechanism_ssl's ssl_cert_login_from."""
        if not self.peer_cert:
            return None
        if source == "distinguished_name":
            return self.peer_cert_subject
        if source == "subject_alternative_name":
            names = [value for kind, value in self.peer_cert.get("subjectAltName", ()) if kind in ("DNS", "email")]
            return names[0] if names else None
        rdn: tuple[tuple[str, str], ...]  # getpeercert()'s subject: relative names, (key, value) pairs
        for rdn in self.peer_cert.get("subject", ()):
            for key, value in rdn:
                if key == "commonName":
                    return value
        return None


_RDN_SHORT = {"commonName": "CN", "organizationName": "O", "organizationalUnitName": "OU", "countryName": "C",
              "stateOrProvinceName": "ST", "localityName": "L", "emailAddress": "emailAddress",
              "domainComponent": "DC"}


def _distinguished_name(rdns: Any) -> str:
    # RabbitMQ prints subjects most-specific first: "CN=client,O=Example".
    parts = [f"{_RDN_SHORT.get(key, key)}={value}" for rdn in reversed(rdns) for key, value in rdn]
    return ",".join(parts)


def session_of(ssl_object: ssl.SSLObject | ssl.SSLSocket | None) -> TlsSession | None:
    """The negotiated parameters of an established TLS session, or None on a plain socket."""
    if ssl_object is None:
        return None
    name, version, _bits = ssl_object.cipher() or ("", "", 0)
    key_exchange, hash_name = _cipher_parts(name, version)
    return TlsSession(
        protocol=(ssl_object.version() or version).lower(),
        cipher=name,
        key_exchange=key_exchange,
        hash=hash_name,
        peer_cert=ssl_object.getpeercert() or None,
    )


def _cipher_parts(name: str, version: str) -> tuple[str, str]:
    """RabbitMQ's ssl_key_exchange and ssl_hash from an OpenSSL cipher name."""
    if name.startswith("TLS_"):  # TLS 1.3: the key exchange is always (EC)DHE, named "any" by OTP
        return "any", name.rsplit("_", 1)[-1].lower()
    parts = name.split("-")
    key_exchange = {"ECDHE": "ecdhe_", "DHE": "dhe_"}.get(parts[0], "")
    if key_exchange:
        key_exchange += parts[1].lower() if len(parts) > 1 else ""
    else:
        key_exchange = "rsa"
    hash_name = parts[-1].lower() if parts[-1].startswith("SHA") else "aead"
    return key_exchange, hash_name
